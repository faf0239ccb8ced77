"""Ray's test helpers that the ported tests import, rewritten for Cairn's test machinery.

* :func:`create_dict_checkpoint` / :func:`load_dict_checkpoint`: as in Ray's
  ``ray/train/tests/util.py`` (a directory with one pickled dict, ``data.pkl``).
* :func:`simulate_s3_bucket`: as ``ray._common.test_utils.simulate_s3_bucket``, a moto
  S3 server on ``localhost:<port>``, yielding ``s3://<fresh bucket>?region=..&
  endpoint_override=http://localhost:<port>`` with test credentials in the environment.
* :class:`URI`: the little of ``ray.air._internal.uri_utils.URI`` the tests use
  (``name``, ``/``, ``str``), keeping query parameters after the path.
* :func:`create_remote_signal_actor`: needs a Ray cluster; calling it skips the test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from cairn import Checkpoint

_AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


@contextlib.contextmanager
def create_dict_checkpoint(data: dict[str, Any]) -> Iterator[Checkpoint]:
    with tempfile.TemporaryDirectory() as tmpdir:
        with open(os.path.join(tmpdir, "data.pkl"), "wb") as f:
            cloudpickle.dump(data, f)
        yield Checkpoint.from_directory(tmpdir)


def load_dict_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "data.pkl"), "rb") as f:
            data: dict[str, Any] = cloudpickle.load(f)
            return data


@contextlib.contextmanager
def simulate_s3_bucket(port: int = 5002, region: str = "us-west-2") -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    saved = {name: os.environ.get(name) for name in _AWS_TEST_ENV}
    os.environ.update(_AWS_TEST_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield (f"s3://{uuid.uuid4().hex}?region={region}"
               f"&endpoint_override=http://localhost:{port}")
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class URI:
    def __init__(self, uri: str) -> None:
        self._parsed = urllib.parse.urlparse(str(uri))

    @property
    def name(self) -> str:
        path = self._parsed.path.rstrip("/")
        return path.rsplit("/", 1)[-1] if path else self._parsed.netloc

    def __truediv__(self, part: str) -> URI:
        path = self._parsed.path.rstrip("/") + "/" + part.strip("/")
        return URI(urllib.parse.urlunparse(self._parsed._replace(path=path)))

    def __str__(self) -> str:
        return urllib.parse.urlunparse(self._parsed)


def create_remote_signal_actor(ray: Any) -> Any:
    pytest.skip("needs a Ray cluster: the test synchronizes through a Ray actor")


def download_from_fs_path(fs: Any, fs_path: str, local_path: str) -> None:
    """Ray's ``_download_from_fs_path``: copy the tree at ``fs_path`` on ``fs`` into
    ``local_path``."""
    import pyarrow.fs

    os.makedirs(local_path, exist_ok=True)
    pyarrow.fs.copy_files(fs_path, local_path, source_filesystem=fs,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())
