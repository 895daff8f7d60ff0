"""Preflight: check a run on a CPU before any GPU is requested.

The config must validate, the MLflow tracking server must answer, every `s3://` location the run uses
(artifact root, model path, inputs) needs credentials from the environment and an existing bucket, and
every input must exist. All problems are reported together in one line.
"""

from __future__ import annotations

import json
import tempfile
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain import resolve
from posttrain.config import Config, check_key, read_params
from posttrain.markers import OptionsOf, marker_of
from posttrain.errors import UserError
from posttrain.orchestration.schema import values_to_raw
from posttrain.tracking import check_stores


def resolve_config(params: Path, values_json: list[str], overrides: list[str], stages: tuple[str, ...] = ()) -> Config:
    """params.yaml (or, when `values_json` carries every section, those values alone) + values + overrides.
    `stages` (a pipeline's): only the settings sections they read are validated and kept, as each of those stages
    will read them, so a bad value in a section none of them reads stops no run of that pipeline; a key given there
    must still be a setting. No `stages`: every registered section."""
    raw: dict[str, Any] = read_params(params) if params.is_file() else {}
    given: list[str] = []
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
            given += [f"{section}.{key}" for key in section_values]
    if not raw:
        raise UserError(f"params file not found: {params} (and no --values-json given)")
    if stages:
        _are_settings(given, resolve.settings_model(stages))
    _absent_optional_is_null(raw)
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "params.yaml"
        merged.write_text(yaml.safe_dump(raw, sort_keys=False))
        return resolve.load(merged, overrides, stages or None)


def _are_settings(keys: list[str], read: type[BaseModel]) -> None:
    """Each `section.key` of a section the run does not read (left out unvalidated) must still name a setting: a
    misspelt key in a trigger's conf is refused by name, whichever section it is in."""
    known = resolve.settings_model()
    for name in keys:
        section = name.partition(".")[0]
        if section in known.model_fields and section not in read.model_fields:
            check_key(name, known)


def without_nulls(section: dict[str, Any]) -> dict[str, Any]:
    """Kubeflow parameters cannot hold null; such keys are left out (at any depth) and read back as null."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in section.items() if v is not None}


def _absent_optional_is_null(raw: dict[str, Any], model: type[BaseModel] | None = None) -> None:
    """Undo `without_nulls`: an absent optional key is null, in every section (the recipes' and plugins' too: the
    settings model by default), nested model and options block."""
    for key, field in (model or resolve.settings_model()).model_fields.items():
        values = raw.get(key)
        annotation = field.annotation
        if key not in raw and type(None) in typing.get_args(annotation):
            raw[key] = None
        elif isinstance(values, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _absent_optional_is_null(values, annotation)
        elif isinstance(marker_of(field.metadata), OptionsOf) and isinstance(values, dict):  # per-method blocks, typed by their entry
            for name, block in values.items():
                schema = resolve.option_schema(name, marker_of(field.metadata).registries)
                if schema is not None and isinstance(block, dict):
                    _absent_optional_is_null(block, schema)


def config_text(cfg: Config) -> str:
    """The resolved settings as YAML that `--params` reads back unchanged (not JSON: YAML 1.1 reads 1e-06 as a string)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=True)


def preflight(cfg: Config, inputs: dict[str, str]) -> list[str]:
    """Every problem that would make the run fail later, as short sentences (empty: ready to go)."""
    s3_inputs = tuple(u for u in (*inputs.values(), cfg.model.path or "") if u.startswith("s3://"))
    problems = check_stores(cfg, s3_inputs)
    for name, uri in inputs.items():
        if "://" not in uri and not Path(uri).exists():
            problems.append(f"input {name!r} not found: {uri}")
    return problems
