"""recipes/image/dvc.yaml (the image pipeline) only maps paths and params onto real CLI stages, run from the repository
root on the recipe's own params file, consuming only what its own stages produce."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO
from posttrain.resolve import all_registries, settings_model

SPEC = yaml.safe_load((REPO / "recipes" / "image" / "dvc.yaml").read_text())
OWN = "recipes/image/params.yaml"


def command(stage: dict) -> list[str]:
    return shlex.split(stage["cmd"].replace("${run}", SPEC["vars"][0]["run"]))


def test_the_chain_is_city_curate_flow_sft_flow_rl_flow_eval():
    assert list(SPEC["stages"]) == ["city", "curate", "flow_sft", "flow_rl", "flow_eval"]


def test_every_command_is_a_registered_stage_run_from_the_repository_root():
    stages = all_registries()["stages"]
    for name, stage in SPEC["stages"].items():
        argv = command(stage)
        assert stage["wdir"] == "../.."
        assert argv[0] == "posttrain" and argv[1] == name and name in stages
        inputs = [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--in"]
        assert set(inputs) <= set(stages.entry(name).meta["inputs"]), (name, inputs)
        assert argv[argv.index("--launcher") + 1] == "dvc" and argv[argv.index("--params") + 1] == OWN
        out = argv[argv.index("--out") + 1]
        declared = stage.get("outs", []) + [next(iter(m)) for m in stage.get("metrics", [])] + [next(iter(p)) for p in stage.get("plots", [])]
        assert all(d.startswith(out + "/") for d in declared), (name, declared)


def test_params_exist_and_inputs_come_from_upstream_outs():
    sections = set(settings_model().model_fields)
    produced = {o for s in SPEC["stages"].values() for o in s.get("outs", [])}
    for name, stage in SPEC["stages"].items():
        keys = [k for entry in stage["params"] for k in ([entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks])]
        assert set(keys) <= sections, name
        assert [list(e) for e in stage["params"] if not isinstance(e, str)] == [[OWN]], name  # the recipe's sections, from its file
        for dep in stage["deps"]:
            assert dep in produced if dep.startswith("outputs/") else (REPO / dep).exists(), (name, dep)


def test_the_params_file_extends_the_root_and_holds_every_section_the_pipeline_tracks():
    own = yaml.safe_load((REPO / OWN).read_text())
    tracked = {k for s in SPEC["stages"].values() for e in s["params"] if not isinstance(e, str) for k in e[OWN]}
    assert own.pop("extends") == "../../params.yaml" and tracked == set(own)
    assert not tracked & set(yaml.safe_load((REPO / "params.yaml").read_text()))  # the root file no longer names them
