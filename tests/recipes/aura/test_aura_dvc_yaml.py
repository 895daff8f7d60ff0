"""recipes/aura/dvc.yaml (AURA on the market sandbox, outside the default `dvc repro`) maps paths and params onto real
CLI stages, runs them from the repository root, reads recipes/aura/params.yaml (a valid config: the market task, PPO, AURA's
reward), and only consumes outputs some stage of it produces."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO, expanded_stages
from posttrain import resolve

AURA = REPO / "recipes" / "aura" / "dvc.yaml"


def test_aura_commands_inputs_outputs_and_params(tmp_path):
    variables = {k: v for item in yaml.safe_load(AURA.read_text())["vars"] for k, v in item.items()}
    text = AURA.read_text()
    for key, value in variables.items():
        text = text.replace("${" + key + "}", value)
    path = tmp_path / "dvc.yaml"
    path.write_text(text)
    aura = expanded_stages(path)
    stages, sections = resolve.all_registries()["stages"], set(resolve.settings_model().model_fields)
    assert set(aura) == {"aura_data", "aura_sft", "aura_rl", "aura_eval@sft", "aura_eval@rl"}
    assert not set(aura) & set(expanded_stages())  # stage names apart from ./dvc.yaml's: one task per name across the pipelines
    produced = {o for s in aura.values() for o in s.get("outs", [])}
    for name, stage in aura.items():
        assert stage["wdir"] == "../..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] in stages and name.split("@")[0] == f"aura_{argv[1]}" and argv[argv.index("--launcher") + 1] == "dvc", name
        assert argv[argv.index("--params") + 1] == "recipes/aura/params.yaml", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert out.startswith("outputs/aura/") and all(o.startswith(out + "/") for o in stage["outs"]), name
        for block in stage["params"]:
            (file, keys), = block.items()
            assert (REPO / file).exists() and set(keys) <= sections, name
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced or dep.rstrip("/") + "/model" in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    assert "--resume" in shlex.split(aura["aura_rl"]["cmd"]) and "--resume" in shlex.split(aura["aura_sft"]["cmd"])
    assert "outputs/aura/rl/critic" in aura["aura_rl"]["outs"]  # PPO's trained critic is versioned with the policy
    cfg = resolve.load(REPO / "recipes" / "aura" / "params.yaml", [])
    assert cfg.task.name == "market" and cfg.rl.preset == "ppo" and cfg.rl.advantage == "gae" and "value" in cfg.rl.aux
    assert [r.name for r in cfg.rl.rewards if r.weight > 0] == ["aura"]
    assert cfg.model.max_positions >= 6 + cfg.rl.max_new_tokens  # a prompt and a whole episode fit
