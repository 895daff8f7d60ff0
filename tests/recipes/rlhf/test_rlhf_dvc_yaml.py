"""recipes/rlhf/dvc.yaml (the reward-model and preference chains outside the default `dvc repro`) maps paths and params
onto real CLI stages, runs them from the repository root, and only consumes outputs some stage produces."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO, expanded_stages
from posttrain.resolve import all_registries, settings_model

RLHF = REPO / "recipes" / "rlhf" / "dvc.yaml"
PARAMS = "recipes/rlhf/params.yaml"


def test_rlhf_commands_inputs_outputs_and_params():
    root, rlhf = expanded_stages(), expanded_stages(RLHF)
    stages = all_registries()["stages"]  # knowledge, edit and care are recipes' stages
    produced = {o for s in [*root.values(), *rlhf.values()] for o in s.get("outs", [])}
    assert {"reward_model", "rl_rm", "preference", "eval@rl_rm", "eval@preference", "knowledge", "edit", "care"} == set(rlhf)
    for name, stage in rlhf.items():
        assert stage["wdir"] == "../..", name  # paths below are relative to the repository root
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        entry = stages.entry(argv[1])
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(entry.meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        assert argv[argv.index("--params") + 1] == PARAMS, name  # the core params.yaml plus rlhf's own sections
        for entry in stage["params"]:  # DVC reads each key from the file that holds it
            files = {"params.yaml": [entry]} if isinstance(entry, str) else entry
            for path, keys in files.items():
                held = set(yaml.safe_load((REPO / path).read_text())) & set(settings_model().model_fields)
                assert path in ("params.yaml", PARAMS) and {k.split(".")[0] for k in keys} <= held, (name, entry)
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
        for path in inputs.values():
            assert any(o.startswith(path + "/") for o in produced), (name, path)


def test_default_pipeline_stays_without_the_extra_models():
    assert not {"reward_model", "rl_rm", "preference", "knowledge", "edit", "care"} & set(expanded_stages())
