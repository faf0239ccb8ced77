"""A multipart upload to S3 interrupted by ``kill -9`` leaves no committed checkpoint and
no visible partial one (real worker, real SIGKILL, the moto S3 server)."""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import urlsplit

import boto3
import multipart_workloads
import pytest

import cairn


@pytest.mark.slow
def test_a_worker_killed_mid_multipart_upload_leaves_nothing_visible(
    s3_uri_factory: Callable[[str], str], s3_endpoint: str, scratch: str,
) -> None:
    storage = s3_uri_factory("multipart")
    parts = urlsplit(storage)
    bucket, prefix = parts.netloc, parts.path.strip("/") + "/run/"
    result = cairn.Trainer(
        multipart_workloads.killed_mid_upload,
        train_loop_config={"endpoint": s3_endpoint, "bucket": bucket, "prefix": prefix,
                           "scratch": scratch},
        scaling_config=cairn.ScalingConfig(num_workers=1),
        run_config=cairn.RunConfig(name="run", storage_path=storage, progress=0,
                                   failure_config=cairn.FailureConfig(max_failures=1)),
    ).fit()
    assert result.error is None and result.checkpoint is None
    # The worker was killed while S3 listed big.bin's multipart upload as in flight.
    assert os.path.exists(os.path.join(scratch, "killed_mid_upload"))
    read_back = cairn.Result.from_path(f"{storage.split('?')[0]}/run?{parts.query}")
    assert read_back.best_checkpoints == []
    client = boto3.client("s3", endpoint_url=f"http://{s3_endpoint}", region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "interrupted/")
    # Neither the small file uploaded in full nor any part of the big one is visible.
    assert listed.get("KeyCount", 0) == 0, [o["Key"] for o in listed.get("Contents", [])]
