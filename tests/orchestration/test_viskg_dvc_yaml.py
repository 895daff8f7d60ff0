"""viskg/dvc.yaml (VisKG outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them from
the repository root, consumes only what its own stages produce, and feeds the SFT model to viskg_rl."""

from __future__ import annotations

import shlex

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages
from test_dvc_yaml import expanded_stages

VISKG = REPO / "viskg" / "dvc.yaml"


def test_viskg_commands_inputs_outputs_and_params():
    root, viskg = expanded_stages(), expanded_stages(VISKG)
    produced = {o for s in viskg.values() for o in s.get("outs", [])}
    assert {"viskg_sft", "viskg_rl"} == set(viskg)
    for name, stage in viskg.items():
        assert stage["wdir"] == "..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] == name in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]) and "--resume" in argv, (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        for key in stage["params"]:
            section, *rest = key.split(".")
            model = Config.model_fields[section].annotation
            for part in rest:
                assert part in model.model_fields, (name, key)
                model = model.model_fields[part].annotation
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    assert "model=outputs/viskg_sft" in shlex.split(viskg["viskg_rl"]["cmd"]) and "outputs/viskg_sft/model" in viskg["viskg_rl"]["deps"]
    assert not set(viskg) & set(root)
