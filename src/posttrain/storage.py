"""Object storage: stage inputs given by URI, S3 checks, and a bounded time for every S3 request.

`posttrain <stage> --in policy=s3://bucket/models/sft` reads the objects under that prefix into a local cache
once (`$POSTTRAIN_CACHE`, default `~/.cache/posttrain/inputs`) and hands the stage that directory, so a large
model is read straight from the store by the step that needs it instead of being copied through every step.
`file://` URIs and plain paths are used where they lie. Credentials and endpoint come from the environment
(`AWS_*`, `AWS_ENDPOINT_URL`), as for MLflow and DVC.

An endpoint that is down or frozen must cost seconds, not boto3's default of 60 s per read times several
attempts per request: every client gets `client_config()` (`$POSTTRAIN_STORAGE_TIMEOUT` seconds per connect and
read, default 15; `$AWS_MAX_ATTEMPTS` attempts, default 3, with standard backoff), and `bound_default_clients`
gives it to the clients other libraries make (MLflow's S3 artifact store).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from posttrain.errors import UserError
from posttrain.uris import error_line, redact_uri

MODEL = "model"  # a stage output holds its model here


def model_dir(path: Path) -> Path:
    """The checkpoint directory of a model input: a stage output's `model/`, or the input itself when it is a plain
    `save_pretrained` directory (a pretrained checkpoint given as `--in policy=DIR`, a published reward model)."""
    nested = path / MODEL
    if (nested / "config.json").is_file() or not (path / "config.json").is_file():
        return nested
    return path


def is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    """A local directory for `location`: a path or `file://` URI as is, an `s3://` prefix fetched into the cache."""
    if location.startswith("file://"):
        return Path(location.removeprefix("file://"))
    if not is_remote(location):
        return Path(location)
    if not location.startswith("s3://"):
        raise UserError(f"input URI {redact_uri(location)!r}: only s3:// and file:// are supported")
    return fetch_s3(location, Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain" / "inputs")))


def timeout_s() -> float:
    return float(os.environ.get("POSTTRAIN_STORAGE_TIMEOUT", "15"))


def client_config():
    """Bounded connect and read time, a few retried attempts."""
    from botocore.config import Config

    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS", "3"))
    return Config(connect_timeout=timeout_s(), read_timeout=timeout_s(), retries={"total_max_attempts": attempts, "mode": "standard"})


def bound_default_clients() -> None:
    """Make `client_config()` the default of every boto3 client created from now on in this process, those made
    by other libraries included (a client's own config still wins key by key)."""
    import boto3
    import botocore.session

    session = botocore.session.get_session()
    session.set_default_client_config(client_config())
    boto3.setup_default_session(botocore_session=session)


def s3_client():
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint, config=client_config())


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def check_s3(uris: list[str]) -> list[str]:
    """Problems with `uris` (credentials, buckets, non-empty prefixes), as short sentences; within the bounded time."""
    if not uris:
        return []
    import boto3
    import botocore.exceptions

    if boto3.Session().get_credentials() is None:
        return [f"no AWS credentials in the environment for {redact_uri(uris[0])} (set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"]
    client = s3_client()
    problems = []
    for uri in uris:
        bucket, key = split_s3(uri)
        try:
            client.head_bucket(Bucket=bucket)
            if key and not client.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/", MaxKeys=1).get("KeyCount"):
                problems.append(f"{redact_uri(uri)} has no objects")
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
            problems.append(f"{redact_uri(uri)}: {error_line(e)}")
    return problems


def fetch_s3(uri: str, cache: Path) -> Path:
    """Every object under the `s3://bucket/prefix` directory, in `cache`; reused while the listing (keys and
    ETags) is unchanged. Written to a staging directory of its own and renamed, so a fetch that breaks (or is killed)
    leaves nothing half done and two fetches of one URI do not mix their files; a broken fetch is one line."""
    import boto3.exceptions
    import botocore.exceptions
    from boto3.s3.transfer import TransferConfig

    broken = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error)
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    shown = redact_uri(uri)
    client = s3_client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        objects = {o["Key"][len(prefix) :]: o["ETag"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")}
    except broken as e:
        raise UserError(f"cannot list {shown}: {error_line(e)}") from None
    if not objects:
        raise UserError(f"input {shown} has no objects")
    listing = json.dumps(objects, sort_keys=True)
    target = cache / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if (target / ".listing.json").is_file() and (target / ".listing.json").read_text() == listing:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=cache))
    try:
        for relative in objects:
            destination = staging / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            # one transfer attempt: each request already has its bounded retries (client_config)
            client.download_file(bucket, prefix + relative, str(destination), Config=TransferConfig(num_download_attempts=1))
        (staging / ".listing.json").write_text(listing)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except (*broken, OSError) as e:
        raise UserError(f"cannot fetch {shown} into {cache}: {error_line(e)} (nothing was kept; run again)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the rename succeeded
    return target


def local_data(location: str) -> Path:
    """A local file or directory for a data `location`: `local_path`, except that an `s3://` URI naming one
    object (a data file: `s3://bucket/problems.jsonl`) is fetched as that file, into the same cache."""
    if not location.startswith("s3://"):
        return local_path(location)
    import botocore.exceptions

    bucket, _, key = location.removeprefix("s3://").partition("/")
    client = s3_client()
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
