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
  objective `needs` has a registered provider (trainers/extras.py); a recipe section's own rule (meta `check`);
  the `rl_rm` stage's reward list names the trained reward-model kind; best-of-N (`eval.best_of_n.n` > 1) needs a
  stochastic `eval.sampler`. (A field that takes only some entries of
  a registry says so in its marker: `Registered("presets", meta="distill")`, checked with the names.)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from posttrain import config
from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.registry import Registry, resolve_section, update_section
from posttrain.registry import option_schema as registry_option_schema


def all_registries() -> dict[str, Registry]:
    """Every registry, with its implementations imported so that all names are present, plugins' included."""
    from posttrain import objectives, rewards, stages, tasks
    from posttrain.data.preferences import preference_data
    from posttrain.envs.retrievers import retrievers
    from posttrain.objectives.preference import preference_objectives
    from posttrain.objectives.presets import presets
    from posttrain.objectives.off_policy import corrections
    from posttrain.rollout.pool import pool_policies
    from posttrain.rollout.samplers import samplers
    from posttrain.trainers.extras import extras
    from posttrain.rollout.tree import tree_policies

    from posttrain import plugins

    registries = {
        "advantages": objectives.advantages,
        "losses": objectives.losses,
        "loss_aggregations": objectives.aggregations,
        "auxiliaries": objectives.auxiliaries,
        "presets": presets,
        "extras": extras,
        "rewards": rewards.rewards,
        "reward_models": rewards.reward_models,
        "preference_objectives": preference_objectives,
        "preference_data": preference_data,
        "tasks": tasks.tasks,
        "stages": stages.stages,
        "sections": stages.sections,
        "samplers": samplers,
        "corrections": corrections,
        "pool_policies": pool_policies,
        "retrievers": retrievers,
        "tree_policies": tree_policies,
    }
    plugins.load(registries)  # the installed plugins' parts (entry points `posttrain.plugins`), once per process
    return registries


def load(params: Path | str, overrides: list[str] | tuple[str, ...] = (), stage: str | Iterable[str] | None = None) -> Config:
    """`config.load` with presets expanded from the registry, then `check`: the settings a run uses. For a `stage`,
    only the sections it reads are validated (`settings_model(stage)`): a recipe's or plugin's section another stage
    reads is left out, so a bad value there stops that stage only. Several stages (a pipeline's, for its preflight):
    the sections any of them reads."""
    from posttrain.objectives.presets import expand

    cfg = check(config.load(params, overrides, expand_preset=expand, model=settings_model(stage), known=settings_model()))
    _warn_credentials(overrides)
    return cfg


def settings_model(stage: str | Iterable[str] | None = None) -> type[Config]:
    """The settings of a run: `Config`'s core sections and every section a recipe or plugin registered; of a `stage`'s
    run, the core sections and the added ones it reads (its registry meta `sections`, e.g. `sections=("dsp",)`); of
    several stages (a pipeline's), the core sections and the added ones any of them reads."""
    registries = all_registries()
    added = list(registries["sections"])
    if stage is not None:
        reads = set()
        for name in (stage,) if isinstance(stage, str) else stage:
            sections = tuple(registries["stages"].entry(name).meta.get("sections", ()))
            missing = [section for section in sections if section not in registries["sections"]]
            if missing:
                raise UserError(f"stage {name!r} reads settings section {missing[0]!r}, which no recipe or plugin registered")
            reads.update(sections)
        added = [e for e in added if e.name in reads]
    return config.settings_model(config.AddedSection(e.name, e.obj, e.meta.get("default"), e.meta.get("help", "")) for e in added)


# a whole `_`-separated part of the key's last name: `hf_token`, `api_key`, not `max_new_tokens`
_CREDENTIAL_KEY = re.compile(r"(?:^|_)(password|passwd|secret|token|api_?key|access_?key|credentials?)(?:$|_)", re.IGNORECASE)
_URI_USERINFO = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _warn_credentials(overrides) -> None:
    """A secret in `--set` is visible in the process list and the launchers' logs: say so (never echo the value).
    Secrets travel by environment variables (AWS_*, MLFLOW_TRACKING_USERNAME/PASSWORD, ...)."""
    for item in overrides:
        key, _, value = item.partition("=")
        if _CREDENTIAL_KEY.search(key.rsplit(".", 1)[-1]) or _URI_USERINFO.search(value):
            print(f"posttrain: warning: --set {key} looks like it carries a credential, which the process list and "
                  "logs show; pass secrets by environment variables instead", file=sys.stderr)


def check(cfg: Config) -> Config:
    """`cfg` checked against every registry, with its options blocks parsed (raises UserError, one line)."""
    registries = all_registries()
    cfg = resolve_section(cfg, "", registries)
    _check_meta(cfg, registries)
    for added in registries["sections"]:  # a recipe's own rules across its settings and the registries (meta `check`)
        if "check" in added.meta and hasattr(cfg, added.name):
            added.meta["check"](getattr(cfg, added.name), registries)
    return cfg


def updated(model: BaseModel, key: str, **update: Any) -> BaseModel:
    """`model` (a section, e.g. `cfg.rl`) with `update` applied and resolved again; `options` merge block by block.
    An rl section also has its needs checked against the providers."""
    from posttrain.config import RLConfig
    from posttrain.trainers.extras import check_providers

    model = update_section(model, key, all_registries(), **update)
    if isinstance(model, RLConfig):
        check_providers(model, key)
    return model


def section(model: BaseModel, key: str) -> BaseModel:
    """One section (e.g. a derived `rl` section) checked and parsed like `check` does for a whole config."""
    return updated(model, key)


def option_schema(name: str, kinds: tuple[str, ...]) -> type[BaseModel] | None:
    """The options model declared by the component registered as `name` in one of `kinds`, if any."""
    return registry_option_schema(name, kinds, all_registries())


# --- meta rules -------------------------------------------------------------------------------------------

def _check_meta(cfg: Config, registries: dict[str, Registry]) -> None:
    rl = cfg.rl
    used = [("rl.advantage", "advantages", rl.advantage), ("rl.loss", "losses", rl.loss)]
    used += [("rl.aux", "auxiliaries", a) for a in rl.aux] + [("rl.rewards", "rewards", r.name) for r in rl.rewards]
    for key, kind, name in used:
        fits = registries[kind].entry(name).meta.get("tasks")
        if fits and cfg.task.name not in fits:
            raise UserError(f"{key}: {name} needs task.name in {{{', '.join(fits)}}} (got {cfg.task.name!r})")
    from posttrain.trainers.extras import check_providers

    check_providers(rl)
    from posttrain.trainers.async_rl import check_async

    check_async(rl, registries["tasks"].get(cfg.task.name))  # rl.mode async: what it does not support

    if cfg.eval.best_of_n.n > 1 and not registries["samplers"].entry(cfg.eval.sampler).meta.get("stochastic"):
        raise UserError(f"eval.best_of_n.n: {cfg.eval.sampler} draws one answer per prompt; best-of-N needs a stochastic eval.sampler "
                        f"({', '.join(e.name for e in registries['samplers'] if e.meta.get('stochastic'))})")

    trained = [r.name for r in cfg.reward_model.rl_rewards if r.name in registries["reward_models"] and r.name != cfg.reward_model.kind]
    if trained:  # rl_rm hands its reward_model input to the reward named `kind` only
        kind = cfg.reward_model.kind
        raise UserError(f"reward_model.rl_rewards: {trained[0]} is not the trained reward_model.kind ({kind}); list {kind} instead")

