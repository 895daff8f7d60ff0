"""Settings checked against the registries: the one boundary where names become components.

`config.py` is a leaf: it validates the structure of `params.yaml` and marks the fields that name a
registry entry (`Registered`) or hold per-component settings (`OptionsOf`). This module, used by the CLI,
preflight and the stages that derive settings (distill), checks a loaded `Config` against the registries
before any work:

- every marked name is registered (one line with close matches otherwise);
- every options block belongs to a component that declares an options model, validates against it and is
  parsed here, once per run (`section.options_for(name)` then returns the parsed model); every component in
  use that declares options has its block;
- meta rules: a component registered for some tasks only (meta `tasks`) refuses the others; every tensor the
  objective `needs` has a registered provider (trainers/extras.py); distill.method is a distillation preset;
  image RL takes a reward-matrix estimator (meta `on_rewards`); a flow backend's meta requirements hold; the
  `rl_rm` stage's reward list names the trained reward-model kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from posttrain import config
from posttrain.config import Config, OptionsOf, Registered
from posttrain.errors import UserError
from posttrain.registry import Registry


def all_registries() -> dict[str, Registry]:
    """Every registry, with its implementations imported so that all names are present."""
    from posttrain import objectives, rewards, stages, tasks
    from posttrain.data.preferences import preference_data
    from posttrain.data.vigor.steps import change_classifiers, embedders, geometric_checks, instruction_writers
    from posttrain.models.flow import flow_backends
    from posttrain.objectives.editing import edit_methods
    from posttrain.objectives.preference import preference_objectives
    from posttrain.objectives.presets import presets
    from posttrain.rewards.care_reward import care_weight_sources
    from posttrain.rewards.image import image_rewards
    from posttrain.trainers.extras import extras

    import posttrain.models.flux  # noqa: F401  (registers the flux kind)

    return {
        "advantages": objectives.advantages,
        "losses": objectives.losses,
        "loss_aggregations": objectives.aggregations,
        "auxiliaries": objectives.auxiliaries,
        "presets": presets,
        "extras": extras,
        "rewards": rewards.rewards,
        "reward_models": rewards.reward_models,
        "care_weight_sources": care_weight_sources,
        "preference_objectives": preference_objectives,
        "preference_data": preference_data,
        "edit_methods": edit_methods,
        "tasks": tasks.tasks,
        "stages": stages.stages,
        "image_rewards": image_rewards,
        "embedders": embedders,
        "geometric_checks": geometric_checks,
        "change_classifiers": change_classifiers,
        "instruction_writers": instruction_writers,
        "flow_backends": flow_backends,
    }


def load(params: Path | str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """`config.load` with presets expanded from the registry, then `check`: the settings a run uses."""
    return check(config.load(params, overrides, expand_preset=expand_preset))


def expand_preset(name: str, rl: dict[str, Any]) -> dict[str, Any]:
    presets = all_registries()["presets"]
    if name not in presets:
        raise UserError(f"rl.preset: {presets.unknown_message(name)}")
    return presets.get(name)(rl)


def check(cfg: Config) -> Config:
    """`cfg` checked against every registry, with its options blocks parsed (raises UserError, one line)."""
    registries = all_registries()
    _check_names(cfg, registries)
    cfg = _parse_options(cfg, "", registries)
    _check_meta(cfg, registries)
    return cfg


def section(model: BaseModel, key: str) -> BaseModel:
    """One section (e.g. a derived `rl` section) checked and parsed like `check` does for a whole config."""
    registries = all_registries()
    _check_names(model, registries, f"{key}.")
    model = _parse_options(model, f"{key}.", registries)
    if key == "rl":
        _check_needs(model, registries, key)
    return model


def updated(model: BaseModel, key: str, **update: Any) -> BaseModel:
    """`model` (a section, e.g. `cfg.rl`) with `update` applied and resolved again. An `options` update is merged
    block by block over the current settings: `updated(cfg.rl, "rl", options={"qglas": {"gamma_max": 0.5}})`."""
    if "options" in update:
        merged = {name: _raw(block) for name, block in model.options.items()}
        for name, block in update["options"].items():
            merged[name] = {**merged.get(name, {}), **_raw(block)}
        update["options"] = merged
    return section(model.model_copy(update=update), key)


def _raw(block: Any) -> dict[str, Any]:
    return block.model_dump() if isinstance(block, BaseModel) else dict(block or {})


# --- names ------------------------------------------------------------------------------------------------

def _check_names(model: BaseModel, registries: dict[str, Registry], prefix: str = "") -> None:
    for key, marker, value, _ in config.marked_values(model, prefix):
        if isinstance(marker, Registered) and value not in registries[marker.registry]:
            raise UserError(f"{key}: {registries[marker.registry].unknown_message(str(value))}")


# --- options ----------------------------------------------------------------------------------------------

_KIND_WORD = {
    "advantages": "estimator", "losses": "loss", "rewards": "reward", "auxiliaries": "auxiliary term", "tasks": "task",
    "reward_models": "reward model", "preference_objectives": "preference objective", "edit_methods": "edit method",
}


def option_schema(name: str, kinds: tuple[str, ...], registries: dict[str, Registry] | None = None) -> type[BaseModel] | None:
    """The options model declared by the component registered as `name` in one of `kinds`, if any."""
    registries = registries or all_registries()
    for kind in kinds:
        if name in registries[kind]:
            return registries[kind].entry(name).meta.get("options")
    return None


def _parse_options(model: BaseModel, prefix: str, registries: dict[str, Registry]) -> BaseModel:
    """`model` with every `OptionsOf` mapping (its own and its sections') parsed into options models."""
    update: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        marker = config._marker(field.metadata)
        if isinstance(marker, OptionsOf):
            update[name] = _parsed_block(model, value, marker.registries, f"{prefix}{name}", registries)
        elif isinstance(value, BaseModel):
            parsed = _parse_options(value, f"{prefix}{name}.", registries)
            if parsed is not value:
                update[name] = parsed
    return model.model_copy(update=update) if update else model


def _parsed_block(owner: BaseModel, options: dict[str, Any], kinds: tuple[str, ...], where: str, registries) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, values in options.items():
        schema = option_schema(name, kinds, registries)
        if schema is None:
            words = [_KIND_WORD[k] for k in kinds]
            kind = ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]
            raise UserError(f"{where}.{name}: no registered {kind} named {name!r} takes options")
        values = _raw(values)  # a block may already be parsed (a section resolved twice)
        try:
            parsed[name] = schema.model_validate(values)
        except ValidationError as e:
            raise UserError(config.one_line(e, schema, prefix=f"{where}.{name}.")) from None
    used = {v for _, m, v, o in config.marked_values(owner) if isinstance(m, Registered) and m.registry in kinds}
    for name in sorted(used):
        if option_schema(name, kinds, registries) is not None and name not in options:
            raise UserError(f"{where}.{name}: missing; {name}'s settings belong in params.yaml")
    return parsed


# --- meta rules -------------------------------------------------------------------------------------------

def _check_meta(cfg: Config, registries: dict[str, Registry]) -> None:
    rl = cfg.rl
    used = [("rl.advantage", "advantages", rl.advantage), ("rl.loss", "losses", rl.loss)]
    used += [("rl.aux", "auxiliaries", a) for a in rl.aux] + [("rl.rewards", "rewards", r.name) for r in rl.rewards]
    for key, kind, name in used:
        fits = registries[kind].entry(name).meta.get("tasks")
        if fits and cfg.task.name not in fits:
            raise UserError(f"{key}: {name} needs task.name in {{{', '.join(fits)}}} (got {cfg.task.name!r})")
    _check_needs(rl, registries, "rl")

    trained = [r.name for r in cfg.reward_model.rl_rewards if r.name in registries["reward_models"] and r.name != cfg.reward_model.kind]
    if trained:  # rl_rm hands its reward_model input to the reward named `kind` only
        kind = cfg.reward_model.kind
        raise UserError(f"reward_model.rl_rewards: {trained[0]} is not the trained reward_model.kind ({kind}); list {kind} instead")

    presets = registries["presets"]
    if not presets.entry(cfg.distill.method).meta.get("distill"):
        methods = [e.name for e in presets if e.meta.get("distill")]
        raise UserError(f"distill.method: {cfg.distill.method!r} is not a distillation method; choose from {', '.join(methods)}")

    advantages = registries["advantages"]
    if "on_rewards" not in advantages.entry(cfg.flow_rl.advantage).meta:
        usable = [e.name for e in advantages if "on_rewards" in e.meta]
        raise UserError(f"flow_rl.advantage: {cfg.flow_rl.advantage!r} needs token-level rollouts; images take one of {', '.join(usable)}")

    flow = registries["flow_backends"].entry(cfg.flow.kind).meta
    if (flow.get("needs_checkpoint") and cfg.flow.path is None) or (flow.get("needs_lora") and cfg.flow.lora.r == 0):
        raise UserError(f"flow: kind {cfg.flow.kind} needs flow.path (a checkpoint directory) and flow.lora.r > 0 (only adapters train)")


def _check_needs(rl, registries: dict[str, Registry], key: str) -> None:
    """Every tensor the configured objective needs has a registered provider."""
    from posttrain.objectives import needs_of

    providers = registries["extras"]
    for need in sorted(needs_of(rl)):
        if need not in providers:
            raise UserError(f"{key}: the objective needs {need!r}, which no registered extra provides ({providers.unknown_message(need)})")
