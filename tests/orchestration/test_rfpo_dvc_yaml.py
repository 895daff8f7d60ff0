"""rfpo/dvc.yaml (the RFPO chain outside the default `dvc repro`) maps paths and params onto real CLI stages, runs
them from the repository root, only consumes outputs some stage produces, and puts the trained critic in rl_rfpo."""

from __future__ import annotations

import shlex

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages
from test_dvc_yaml import expanded_stages

RFPO = REPO / "rfpo" / "dvc.yaml"


def test_rfpo_commands_inputs_outputs_and_params():
    root, rfpo = expanded_stages(), expanded_stages(RFPO)
    produced = {o for s in [*root.values(), *rfpo.values()] for o in s.get("outs", [])}
    assert {"critic", "rl_rfpo", "eval@rl_rfpo"} == set(rfpo)
    for name, stage in rfpo.items():
        assert stage["wdir"] == "..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        assert {p.split(".")[0] for p in stage["params"]} <= set(Config.model_fields), name
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    rl = shlex.split(rfpo["rl_rfpo"]["cmd"])
    assert "rl.preset=rfpo" in rl and "rl.critic.path=outputs/critic" in rl and "outputs/critic/model" in rfpo["rl_rfpo"]["deps"]
    assert "--resume" in shlex.split(rfpo["critic"]["cmd"]) and "critic" in rfpo["critic"]["params"]
    assert not {"critic", "rl_rfpo"} & set(root)  # the default pipeline stays without them
