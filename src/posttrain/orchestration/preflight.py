"""Preflight: check a run on a CPU before any GPU is requested.

The config must validate, the MLflow tracking server must answer, every `s3://` location the run uses
(artifact root, model path, inputs) needs credentials from the environment and an existing bucket, and
every input must exist. All problems are reported together in one line.
"""

from __future__ import annotations

import json
import os
import tempfile
import typing
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain import resolve
from posttrain.config import Config, OptionsOf, _marker
from posttrain.errors import UserError
from posttrain.orchestration.schema import values_to_raw


def resolve_config(params: Path, values_json: list[str], overrides: list[str]) -> Config:
    """params.yaml (or, when `values_json` carries every section, those values alone) + values + overrides."""
    raw: dict[str, Any] = yaml.safe_load(params.read_text()) if params.is_file() else {}
    for text in values_json:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"--values-json is not JSON: {e.msg} at character {e.pos}") from None
        if not isinstance(values, dict):
            raise UserError("--values-json must be a JSON object of section.key (or section) -> value")
        for section, section_values in values_to_raw(values).items():
            base = raw.get(section) if isinstance(raw.get(section), dict) else {}
            raw[section] = {**base, **section_values}
    if not raw:
        raise UserError(f"params file not found: {params} (and no --values-json given)")
    _absent_optional_is_null(raw)
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "params.yaml"
        merged.write_text(yaml.safe_dump(raw, sort_keys=False))
        return resolve.load(merged, overrides)


def without_nulls(section: dict[str, Any]) -> dict[str, Any]:
    """Kubeflow parameters cannot hold null; such keys are left out (at any depth) and read back as null."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in section.items() if v is not None}


def _absent_optional_is_null(raw: dict[str, Any], model: type[BaseModel] = Config) -> None:
    """Undo `without_nulls`: an absent optional key is null, in every section, nested model and options block."""
    for key, field in model.model_fields.items():
        values = raw.get(key)
        annotation = field.annotation
        if key not in raw and type(None) in typing.get_args(annotation):
            raw[key] = None
        elif isinstance(values, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _absent_optional_is_null(values, annotation)
        elif isinstance(_marker(field.metadata), OptionsOf) and isinstance(values, dict):  # per-method blocks, typed by their entry
            for name, block in values.items():
                schema = resolve.option_schema(name, _marker(field.metadata).registries)
                if schema is not None and isinstance(block, dict):
                    _absent_optional_is_null(block, schema)


def config_text(cfg: Config) -> str:
    """The resolved settings as YAML that `--params` reads back unchanged (not JSON: YAML 1.1 reads 1e-06 as a string)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=True)


def _s3_client():
    import boto3

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint)


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def check_tracking(uri: str) -> list[str]:
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as response:
                return [] if response.status == 200 else [f"MLflow at {uri} answered {response.status}"]
        except (urllib.error.URLError, OSError) as e:
            return [f"MLflow at {uri} is not reachable ({getattr(e, 'reason', e)})"]
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).resolve().parent
        return [] if folder.is_dir() and os.access(folder, os.W_OK) else [f"MLflow store folder {folder} is missing or read-only"]
    return []


def check_s3(uris: list[str]) -> list[str]:
    if not uris:
        return []
    import boto3
    import botocore.exceptions

    if boto3.Session().get_credentials() is None:
        return [f"no AWS credentials in the environment for {uris[0]} (set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"]
    client = _s3_client()
    problems = []
    for uri in uris:
        bucket, key = _split_s3(uri)
        try:
            client.head_bucket(Bucket=bucket)
            if key and not client.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/", MaxKeys=1).get("KeyCount"):
                problems.append(f"{uri} has no objects")
        except (botocore.exceptions.ClientError, botocore.exceptions.EndpointConnectionError) as e:
            problems.append(f"{uri}: {e}")
    return problems


def preflight(cfg: Config, inputs: dict[str, str]) -> list[str]:
    """Every problem that would make the run fail later, as short sentences (empty: ready to go)."""
    problems = check_tracking(cfg.tracking.uri) if cfg.tracking.enabled else []
    s3_buckets = [u for u in (cfg.tracking.artifact_root,) if cfg.tracking.enabled and u.startswith("s3://")]
    s3_buckets = [f"s3://{_split_s3(u)[0]}" for u in s3_buckets]
    s3_inputs = [u for u in (*inputs.values(), cfg.model.path or "") if u.startswith("s3://")]
    problems += check_s3(s3_buckets + s3_inputs)
    for name, uri in inputs.items():
        if "://" not in uri and not Path(uri).exists():
            problems.append(f"input {name!r} not found: {uri}")
    return problems
