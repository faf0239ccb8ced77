"""Ray-only fixtures of the ported Ray Train tests, given Cairn meanings.

* ``ray_start_4_cpus``: Ray starts a local cluster; Cairn's local backend needs none, so
  the fixture only yields.
* (autouse) runs given no ``storage_path`` go where Ray puts them, a default results
  folder, here one inside the test's ``tmp_path`` (``CAIRN_STORAGE_PATH``), so that tests
  never share a run through ``~/cairn_results``.
* ``mock_s3_bucket_uri``: an ``s3://`` URI on the moto server of ``tests/conftest.py``
  (Ray's fixture starts moto on a fixed port; this one shares the session's server).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ray_suite import port_status


@pytest.fixture(autouse=True)
def default_results_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_STORAGE_PATH", str(tmp_path / "cairn_results"))


@pytest.fixture
def ray_start_4_cpus() -> Iterator[None]:
    yield


@pytest.fixture
def mock_s3_bucket_uri(s3_uri_factory: Callable[[str], str]) -> str:
    return s3_uri_factory("ray-suite")


def _matches(pattern: str, key: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), key) is not None


def _status(table: dict[str, str], item: pytest.Item) -> str | None:
    """The entry of ``table`` for ``item`` (keys as port_status.py describes), if any."""
    file_name = Path(str(item.fspath)).name
    function = getattr(item, "originalname", None) or item.name
    keys = (f"{file_name}::{function}", f"{file_name}::{item.name}")
    for pattern, reason in table.items():
        if any(_matches(pattern, key) for key in keys):
            return reason
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Apply port_status.py's marks to the ported tests (see its docstring)."""
    here = Path(__file__).parent
    slow = dict.fromkeys(port_status.SLOW, "slow")
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue
        if (reason := _status(port_status.SKIP, item)) is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        if (reason := _status(port_status.STRICT_XFAIL, item)) is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
        if (reason := _status(port_status.XFAIL, item)) is not None:
            item.add_marker(pytest.mark.xfail(strict=False, reason=reason))
        # A test that hangs fails after this long instead of the suite-wide 300 s.
        if _status(slow, item) is not None:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(300))
        else:
            item.add_marker(pytest.mark.timeout(120))

    # Ray's local-mode tests run the train function, Lightning's DDP strategy included, in
    # this very process (as in Ray's own test process): they run last, so that what they
    # leave in the process (beyond the group and variables ended by the fixture above)
    # meets no other test.
    local_mode = here / "test_local_mode.py"
    last = [item for item in items if Path(str(item.fspath)) == local_mode]
    items[:] = [item for item in items if Path(str(item.fspath)) != local_mode] + last
