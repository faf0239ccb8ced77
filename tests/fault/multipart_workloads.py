"""A worker killed (SIGKILL) while its checkpoint's multipart upload to S3 is in flight."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from typing import Any

import boto3

import cairn


def killed_mid_upload(config: dict[str, Any]) -> None:
    """Attempt 0: an ASYNC report of ``small.txt`` and a 48 MiB ``big.bin``; once S3 lists
    a multipart upload in flight under the run, SIGKILL this worker. Later attempts find
    no committed checkpoint and return."""
    if cairn.get_context().get_attempt() > 0:
        assert cairn.get_checkpoint() is None, "the interrupted checkpoint was committed"
        cairn.report({"step": 1})
        return
    local = tempfile.mkdtemp()
    with open(os.path.join(local, "small.txt"), "w", encoding="utf-8") as f:
        f.write("a small file that is uploaded in full")
    with open(os.path.join(local, "big.bin"), "wb") as f:
        for _ in range(48):
            f.write(os.urandom(1 << 20))
    client = boto3.client("s3", endpoint_url=f"http://{config['endpoint']}",
                          region_name="us-east-1")
    cairn.report({"step": 0}, checkpoint=cairn.Checkpoint.from_directory(local),
                 checkpoint_dir_name="interrupted", checkpoint_upload_mode="ASYNC")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        uploads = client.list_multipart_uploads(Bucket=config["bucket"],
                                                Prefix=config["prefix"]).get("Uploads", [])
        if any(upload["Key"].endswith("/interrupted/big.bin") for upload in uploads):
            with open(os.path.join(config["scratch"], "killed_mid_upload"), "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
    raise AssertionError("no multipart upload of big.bin was seen in flight")
