"""safe_rl/dvc.yaml (VLM-Safe-RL outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them
from the repository root, consumes only what its own stages produce, and feeds the trained encoder to safe_rl."""

from __future__ import annotations

import shlex

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages
from test_dvc_yaml import expanded_stages

SAFE_RL = REPO / "safe_rl" / "dvc.yaml"


def test_safe_rl_commands_inputs_outputs_and_params():
    root, safe = expanded_stages(), expanded_stages(SAFE_RL)
    produced = {o for s in safe.values() for o in s.get("outs", [])}
    assert {"drive_encoder", "safe_rl"} == set(safe)
    for name, stage in safe.items():
        assert stage["wdir"] == "..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] == name and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        for key in stage["params"]:  # a section, or a key of one (safe_rl.encoder)
            section, *rest = key.split(".")
            model = Config.model_fields[section].annotation
            for part in rest:
                assert part in model.model_fields, (name, key)
                model = model.model_fields[part].annotation
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    rl = shlex.split(safe["safe_rl"]["cmd"])
    assert "encoder=outputs/drive_encoder" in rl and "--resume" in rl and "outputs/drive_encoder/model" in safe["safe_rl"]["deps"]
    assert not {"drive_encoder", "safe_rl"} & set(root)  # the default pipeline stays without them
