"""recipes/rfpo/dvc.yaml (the RFPO chain outside the default `dvc repro`) maps paths and params onto real CLI stages,
runs them from the repository root, only consumes outputs some stage produces, and puts the trained critic in rl_rfpo."""

from __future__ import annotations

import shlex

from helpers import REPO, expanded_stages
from posttrain.resolve import all_registries, settings_model

RFPO = REPO / "recipes" / "rfpo" / "dvc.yaml"
PARAMS = "recipes/rfpo/params.yaml"


def test_rfpo_commands_inputs_outputs_and_params():
    stages, settings = all_registries()["stages"], settings_model()
    root, rfpo = expanded_stages(), expanded_stages(RFPO)
    produced = {o for s in [*root.values(), *rfpo.values()] for o in s.get("outs", [])}
    assert {"critic", "rl_rfpo", "eval@rl_rfpo"} == set(rfpo)
    for name, stage in rfpo.items():
        assert stage["wdir"] == "../..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        assert argv[argv.index("--params") + 1] == PARAMS, name  # the recipe's params file (the root one plus `critic`)
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        keys = [k for entry in stage["params"] for k in ([entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks])]
        assert {k.split(".")[0] for k in keys} <= set(settings.model_fields), name
        assert all(isinstance(e, str) or set(e) == {PARAMS} for e in stage["params"]), name
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    rl = shlex.split(rfpo["rl_rfpo"]["cmd"])
    assert "rl.preset=rfpo" in rl and "rl.critic.path=outputs/critic" in rl and "outputs/critic/model" in rfpo["rl_rfpo"]["deps"]
    assert "--resume" in shlex.split(rfpo["critic"]["cmd"]) and {PARAMS: ["critic"]} in rfpo["critic"]["params"]
    assert not {"critic", "rl_rfpo"} & set(root)  # the default pipeline stays without them
