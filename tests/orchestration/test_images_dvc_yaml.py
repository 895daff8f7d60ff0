"""images/dvc.yaml (the image pipeline) only maps paths and params onto real CLI stages."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages

SPEC = yaml.safe_load((REPO / "images" / "dvc.yaml").read_text())


def command(stage: dict) -> list[str]:
    return shlex.split(stage["cmd"].replace("${run}", SPEC["vars"][0]["run"]))


def test_the_chain_is_city_curate_flow_sft_flow_rl_flow_eval():
    assert list(SPEC["stages"]) == ["city", "curate", "flow_sft", "flow_rl", "flow_eval"]


def test_every_command_is_a_registered_stage_run_from_the_repository_root():
    for name, stage in SPEC["stages"].items():
        argv = command(stage)
        assert stage["wdir"] == ".."
        assert argv[0] == "posttrain" and argv[1] == name and name in stages
        inputs = [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--in"]
        assert set(inputs) <= set(stages.entry(name).meta["inputs"]), (name, inputs)
        assert argv[argv.index("--launcher") + 1] == "dvc" and argv[argv.index("--params") + 1] == "params.yaml"
        out = argv[argv.index("--out") + 1]
        declared = stage.get("outs", []) + [next(iter(m)) for m in stage.get("metrics", [])] + [next(iter(p)) for p in stage.get("plots", [])]
        assert all(d.startswith(out + "/") for d in declared), (name, declared)


def test_params_exist_and_inputs_come_from_upstream_outs():
    sections = set(Config.model_fields)
    produced = {o for s in SPEC["stages"].values() for o in s.get("outs", [])}
    for name, stage in SPEC["stages"].items():
        assert set(stage["params"]) <= sections, name
        for dep in stage["deps"]:
            assert dep in produced if dep.startswith("outputs/") else (REPO / dep).exists(), (name, dep)
