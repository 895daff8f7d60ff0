"""Stage inputs given by URI: an existing dataset or model (a checkpoint directory or an `s3://` prefix).

`posttrain <stage> --in policy=s3://bucket/models/sft` reads the objects under that prefix into a local cache
once (`$POSTTRAIN_CACHE`, default `~/.cache/posttrain/inputs`) and hands the stage that directory, so a large
model is read straight from the store by the step that needs it instead of being copied through every step.
`file://` URIs and plain paths are used where they lie. Credentials and endpoint come from the environment
(`AWS_*`, `AWS_ENDPOINT_URL`), as for MLflow and DVC.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from posttrain.errors import UserError


def is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    """A local directory for `location`: a path or `file://` URI as is, an `s3://` prefix fetched into the cache."""
    if location.startswith("file://"):
        return Path(location.removeprefix("file://"))
    if not is_remote(location):
        return Path(location)
    if not location.startswith("s3://"):
        raise UserError(f"input URI {location!r}: only s3:// and file:// are supported")
    return fetch_s3(location, Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain" / "inputs")))


def _s3_client():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None)


def fetch_s3(uri: str, cache: Path) -> Path:
    """Every object under the `s3://bucket/prefix` directory, in `cache`; reused while the listing (keys and
    ETags) is unchanged, written to a staging directory and renamed so a killed fetch leaves nothing half done."""
    import botocore.exceptions

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    client = _s3_client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        objects = {o["Key"][len(prefix) :]: o["ETag"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")}
    except (botocore.exceptions.ClientError, botocore.exceptions.NoCredentialsError, botocore.exceptions.EndpointConnectionError) as e:
        raise UserError(f"cannot list {uri}: {e}") from None
    if not objects:
        raise UserError(f"input {uri} has no objects")
    listing = json.dumps(objects, sort_keys=True)
    target = cache / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if (target / ".listing.json").is_file() and (target / ".listing.json").read_text() == listing:
        return target
    staging = cache / f".{target.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for relative in objects:
        destination = staging / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, prefix + relative, str(destination))
    (staging / ".listing.json").write_text(listing)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def local_data(location: str) -> Path:
    """A local file or directory for a data `location`: `local_path`, except that an `s3://` URI naming one
    object (a data file: `s3://bucket/problems.jsonl`) is fetched as that file, into the same cache."""
    if not location.startswith("s3://"):
        return local_path(location)
    import botocore.exceptions

    bucket, _, key = location.removeprefix("s3://").partition("/")
    client = _s3_client()
    try:
        etag = client.head_object(Bucket=bucket, Key=key)["ETag"] if key and not key.endswith("/") else None
    except botocore.exceptions.ClientError:
        etag = None  # not one object: a prefix (a save_to_disk directory), fetched by local_path
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.EndpointConnectionError) as e:
        raise UserError(f"cannot read {location}: {e}") from None
    if etag is None:
        return local_path(location)
    cache = Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain" / "inputs"))
    target = cache / hashlib.sha256(location.encode()).hexdigest()[:16] / Path(key).name
    stamp = target.with_name(".etag")
    if target.is_file() and stamp.is_file() and stamp.read_text() == etag:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    client.download_file(bucket, key, str(partial))
    partial.replace(target)
    stamp.write_text(etag)
    return target
