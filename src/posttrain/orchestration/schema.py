"""One schema for every entry point, generated from the pydantic config and the registries.

`param_specs` turns the settings (`Config` and the sections recipes and plugins add) into one JSON Schema per
`section.key` (what an Airflow `Param` takes), with registry-backed keys as enums of the registered names, the run's values as defaults and the settings models'
comments as descriptions.
`pipeline_spec` bundles those with the task graph of every pipeline into the JSON the DAG files read,
so that the DAGs import neither posttrain nor torch. `values_to_raw` maps such values back to sections.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from posttrain.markers import Registered, registered_keys
from posttrain.settings_help import field_comments
from posttrain.registry import IMPORT_PATH, Registry, admitted
from posttrain.errors import UserError
from posttrain.orchestration.graph import PARAMS, Task, check_overrides, load_pipelines, params_of
from posttrain.orchestration.sweep import arm_names

ORCHESTRATION_SECTION = "orchestration"  # launcher settings: compile-time, not a run parameter


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline_refs(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def _with_enum(schema: dict[str, Any], registry: Registry, marker: Registered) -> dict[str, Any]:
    """`schema` restricted to the names `marker` admits; a registry that imports `module:attr` names (rewards)
    also takes any such name."""
    # a `module:attr` a run imported this process is no registered name (the pattern branch admits it), so the
    # schema is the same whatever ran before it
    schema, names = copy.deepcopy(schema), [n for n in admitted(registry, marker) if not IMPORT_PATH.fullmatch(n)]
    if "anyOf" in schema:  # `str | None`: the enum goes on the string branch
        schema["anyOf"] = [{**s, "enum": names} if s.get("type") == "string" else s for s in schema["anyOf"]]
    elif registry.importer is not None:
        kept = {k: v for k, v in schema.items() if k != "type"}
        schema = {**kept, "anyOf": [{"type": "string", "enum": names}, {"type": "string", "pattern": f"^{IMPORT_PATH.pattern}$"}]}
    else:
        schema["enum"] = names
    return schema


def param_specs(params_yaml: Path) -> dict[str, dict[str, Any]]:
    """`section.key` -> {"default", "schema", "section", "description"} for every run setting (`resolve.settings_model()`). The
    default is the value a run of `params_yaml` gets (the file over the settings models' defaults); the description
    the comment on the setting's line in its settings model (`settings_help.field_comments`). Keys marked `Registered` in
    config.py (the same markers `posttrain.resolve` checks) are enums of the registered names: a key itself, each
    item of a tuple (`rl.aux[]`), a field of each item (`rl.rewards[].name`), or a field of a nested settings
    object (`motion.rl.advantage`)."""
    from posttrain.resolve import all_registries, settings_model

    registries, model = all_registries(), settings_model()
    marked = registered_keys(model)
    full = model.model_json_schema()
    root = _inline_refs(full, full.get("$defs", {}))
    defaults = run_values(params_yaml)
    specs: dict[str, dict[str, Any]] = {}
    for section, section_schema in root["properties"].items():
        if section == ORCHESTRATION_SECTION:
            continue
        descriptions = field_comments(model.model_fields[section].annotation)
        for key, schema in section_schema["properties"].items():
            name = f"{section}.{key}"
            schema = {k: v for k, v in schema.items() if k not in ("title", "default", "description")}  # the default is the run's, beside the schema
            if name in marked:
                schema = _with_enum(schema, registries[marked[name].registry], marked[name])
            if f"{name}[]" in marked and "items" in schema:
                schema["items"] = _with_enum(schema["items"], registries[marked[f"{name}[]"].registry], marked[f"{name}[]"])
            for field, marker in ((k.removeprefix(f"{name}[]."), m) for k, m in marked.items() if k.startswith(f"{name}[].")):
                item = schema["items"]
                item["properties"][field] = _with_enum(item["properties"][field], registries[marker.registry], marker)
            for path, marker in ((k.removeprefix(f"{name}.").split("."), m) for k, m in marked.items() if k.startswith(f"{name}.") and "[]" not in k):
                parent = schema  # a key of a nested settings object (motion.rl.advantage): the enum inside its object
                for part in path[:-1]:
                    parent = parent["properties"][part]
                parent["properties"][path[-1]] = _with_enum(parent["properties"][path[-1]], registries[marker.registry], marker)
            default = defaults[section][key]
            described = descriptions.get(key) or f"{name} (default: {json.dumps(default, default=str)[:60]})"
            specs[name] = {"default": default, "schema": schema, "section": section, "description": described}
    return specs


def run_values(params_yaml: Path) -> dict[str, dict[str, Any]]:
    """Every setting of a run of `params_yaml` as JSON values: the file over the models' defaults (an `options`
    mapping as the file or the section's default gives it, not every component's parsed block)."""
    from posttrain import config as settings
    from posttrain.resolve import settings_model

    return settings_model().model_validate(settings.read_params(Path(params_yaml))).model_dump(mode="json")


def values_to_raw(values: dict[str, Any]) -> dict[str, Any]:
    """{"rl.advantage": "gdpo", "sft": {...}} -> {"rl": {"advantage": "gdpo"}, "sft": {...}} (later keys win)."""
    raw: dict[str, Any] = {}
    for name, value in values.items():
        section, _, key = name.partition(".")
        if key:
            raw.setdefault(section, {})[key] = value
        elif isinstance(value, dict):
            raw[section] = {**raw.get(section, {}), **value}
        else:
            raise UserError(f"{name!r}: expected section.key = value or section = {{...}}, got {type(value).__name__}")
    return raw


# settings every stage reads (the run's seed and device, the tracking stores, the training loop's safeguards) but that
# no dvc.yaml lists, as they do not change a stage's result: shown in every DAG's trigger form
FORM_SECTIONS = ("pipeline", "tracking", "training")


def task_spec(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "stage": task.stage,
        "inputs": task.inputs,
        "out": task.out,
        "after": list(task.after),
        "resume": task.resume,
        "gpu": task.gpu,
        "extra_args": list(task.extra_args),
        "sections": list(task.sections),
    }


def pipeline_spec(params_yaml: Path, repo: Path) -> dict[str, Any]:
    """Everything a DAG file needs, as plain JSON: the Params, each pipeline's tasks, its `--set` overrides, its
    params file and the defaults in which that file differs from `params_yaml` (a recipe's own settings)."""
    found = load_pipelines(repo)
    for pipeline in found.values():
        check_overrides(pipeline, params_of(pipeline, params_yaml, repo))
    params = param_specs(params_yaml)
    own = {name: p for name, p in found.items() if p.params != PARAMS}
    return {
        "orchestration": run_values(params_yaml)[ORCHESTRATION_SECTION],
        "params": params,
        "pipelines": {name: [task_spec(t) for t in p.tasks] for name, p in found.items()},
        "overrides": {name: list(p.overrides) for name, p in found.items()},
        "params_files": {name: p.params for name, p in own.items()},
        "defaults": {name: _differing(params, params_of(p, params_yaml, repo)) for name, p in own.items()},
        "sweep_arms": arm_names(),  # the sweep DAG's multi-select: presets and advantage estimators
        "form_sections": list(FORM_SECTIONS),  # in every DAG's form, beside the sections its tasks read
    }


def _differing(params: dict[str, dict[str, Any]], own_file: Path) -> dict[str, Any]:
    """`section.key` -> value where a run of `own_file` differs from the defaults in `params` (`param_specs`)."""
    values = run_values(own_file)
    return {name: values[p["section"]][name.split(".", 1)[1]] for name, p in params.items()
            if values[p["section"]][name.split(".", 1)[1]] != p["default"]}


def render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=1, sort_keys=True) + "\n"
