"""The config boundary: config.py marks registry-backed fields, posttrain.resolve checks them against the
registries (names, options, meta rules) before any work, and the launchers' schemas read the same markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain import config, markers, resolve
from posttrain.config import Registered
from posttrain.errors import UserError
from posttrain.registry import IMPORT_PATH

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


def test_the_structural_loader_checks_no_names_and_refuses_presets_without_a_registry():
    # the root params.yaml holds the core's sections only: the structural loader reads it with the core model alone
    cfg = config.load(PARAMS, ["rl.advantage=no_such_estimator"])  # structure only: the name is resolve's business
    assert cfg.rl.advantage == "no_such_estimator"
    with pytest.raises(UserError, match="rl.advantage: unknown advantage estimator 'no_such_estimator'"):
        resolve.check(cfg)
    with pytest.raises(UserError, match="rl.preset: presets are expanded by posttrain.resolve.load"):
        config.load(PARAMS, ["rl.preset=dapo"])


def test_options_are_parsed_once_and_unresolved_blocks_are_refused():
    cfg = resolve.load(PARAMS)
    first = cfg.rl.options_for("qglas")
    assert first is cfg.rl.options_for("qglas")  # the parsed model, not a fresh validation per call
    raw = config.load(PARAMS, ["rl.options.qglas.gamma_max=0.3"], model=resolve.settings_model())  # a block as read, not yet parsed
    with pytest.raises(RuntimeError, match="not resolved"):
        raw.rl.options_for("qglas")
    changed = resolve.updated(cfg.rl, "rl", options={"qglas": {"gamma_max": 0.25}})
    assert changed.options_for("qglas").gamma_max == 0.25
    assert changed.options_for("witness") == cfg.rl.options_for("witness")  # other blocks kept


@pytest.mark.parametrize("override, message", [
    ("distill.method=dapo", "distill.method: 'dapo' is not a distillation method; choose from gats, opd"),
    ("flow_rl.advantage=rloo", "flow_rl.advantage: 'rloo' needs token-level rollouts"),
    ("rl.aux=[opsd, nobody]", "rl.aux.1: unknown auxiliary loss 'nobody'"),
    ("orchestration.trainer.stages=[sft, rll]", "orchestration.trainer.stages.1: unknown stage 'rll'; did you mean 'rl'"),
])
def test_marked_fields_are_checked_with_one_line(override, message):
    with pytest.raises(UserError) as err:
        resolve.load(PARAMS, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_every_marked_key_is_an_enum_of_what_it_admits_in_the_launchers_schema():
    from posttrain.orchestration.schema import param_specs

    specs = param_specs(PARAMS)
    registries = resolve.all_registries()
    for key, marker in markers.registered_keys(resolve.settings_model()).items():  # the recipes' sections too
        section = key.split(".")[0]
        if section == "orchestration":
            continue  # launcher settings are compile-time, not run parameters
        top = ".".join(key.split("[]")[0].split(".")[:2])
        schema = specs[top]["schema"]
        if key.endswith("[]"):
            schema = schema["items"]
        elif "[]." in key:
            schema = schema["items"]["properties"][key.split("[].")[1]]
        for part in key.split(".")[2:] if "[]" not in key else []:  # a field of a nested settings object (motion.rl.advantage)
            schema = schema["properties"][part]
        enum = schema.get("enum") or next(s["enum"] for s in schema["anyOf"] if "enum" in s)
        registered = [e.name for e in registries[marker.registry] if marker.admits(e.meta)]
        # a `module:attr` another test imported in this process is admitted by the pattern branch, not the enum
        assert enum == [n for n in registered if not IMPORT_PATH.fullmatch(n)], key
    assert "dapo" not in specs["distill.method"]["schema"]["enum"] and "opd" in specs["distill.method"]["schema"]["enum"]


def test_a_marker_can_admit_only_entries_with_a_meta_flag():
    marker = Registered("presets", meta="distill", why="is not a distillation method")
    assert marker.admits({"distill": True}) and not marker.admits({}) and Registered("presets").admits({})


def test_a_stage_validates_the_core_sections_and_only_the_added_ones_it_reads(tmp_path):
    """A bad value in a recipe's section stops the stages that read it (one line naming the key) and no other: the
    `sft` stage's settings have no `dsp` section, so neither the file's nor an override's mistake there reaches it.
    A run of no stage in particular holds and checks every section; a pipeline's (its preflight) the sections any of
    its stages reads; a section no recipe registered is refused for every stage."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {PARAMS}\ndsp: {{steps: -1}}\n")
    sft = resolve.load(bad, stage="sft")
    assert not hasattr(sft, "dsp") and sft.sft == resolve.load(PARAMS).sft
    assert not hasattr(resolve.load(PARAMS, ["dsp.steps=-1"], stage="sft"), "dsp")
    for stage in ("dsp", "maze_data", None):
        with pytest.raises(UserError) as err:
            resolve.load(bad, stage=stage)
        assert str(err.value) == "dsp.steps: Input should be greater than 0 (got -1)"
    assert not hasattr(resolve.load(bad, stage=("data", "sft", "rl", "eval")), "dsp")
    with pytest.raises(UserError, match="dsp.steps: Input should be greater than 0"):
        resolve.load(bad, stage=("sft", "maze_data"))
    assert resolve.load(PARAMS, ["dsp.steps=7"], stage="dsp").dsp.steps == 7
    with pytest.raises(UserError, match="unknown key 'dsp.stepz'"):  # an override still names a known key
        resolve.load(PARAMS, ["dsp.stepz=7"], stage="sft")
    bad.write_text(f"extends: {PARAMS}\ndspp: {{steps: 3}}\n")
    with pytest.raises(UserError, match="unknown key 'dspp' \\(did you mean 'dsp'\\?\\)"):
        resolve.load(bad, stage="sft")
    with pytest.raises(UserError, match="unknown key 'sft.stepz'"):  # the core sections are checked for every stage
        resolve.load(PARAMS, ["sft.stepz=1"], stage="dsp")


def test_every_stage_declares_the_added_sections_its_pipelines_track():
    """A stage reads the core sections and the added sections it declares (registry meta `sections`); each dvc.yaml
    task that runs it lists those in its `params:`, so DVC reruns it when they change, and no other added section."""
    from posttrain.orchestration.graph import load_pipelines

    registries = resolve.all_registries()
    added = set(registries["sections"].names())
    for pipeline in load_pipelines(PARAMS.parent).values():
        for task in pipeline.tasks:
            declared = set(registries["stages"].entry(task.stage).meta.get("sections", ()))
            assert declared <= added, task.stage
            assert set(task.sections) & added == declared, (pipeline.name, task.id)
