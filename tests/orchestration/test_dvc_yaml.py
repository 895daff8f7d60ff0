"""dvc.yaml only maps paths and params onto real CLI stages: every command, input and params key exists."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages


def expanded_stages(path=REPO / "dvc.yaml") -> dict[str, dict]:
    spec = yaml.safe_load(path.read_text())["stages"]
    out = {}
    for name, stage in spec.items():
        matrix = stage.get("matrix")
        if not matrix:
            out[name] = stage
            continue
        (key, values), = matrix.items()
        for value in values:
            text = yaml.safe_dump(stage).replace(f"${{item.{key}}}", value)
            out[f"{name}@{value}"] = yaml.safe_load(text)
    return out


def checked_side_pipeline(path, names: set[str]) -> dict[str, dict]:
    """The stages of a pipeline kept out of the default `dvc repro` (safe_rl/, dsp/, ...), checked: exactly `names`, each
    run from the repository root as a registered CLI stage with its own inputs, outs under its --out, params that
    name settings, deps that exist or come from the file's own outs; none of them in ./dvc.yaml."""
    side = expanded_stages(path)
    produced = {o for s in side.values() for o in s.get("outs", [])}
    assert names == set(side)
    for name, stage in side.items():
        assert stage["wdir"] == "..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] == name and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        keys = [k for entry in stage["params"] for k in ([entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks])]
        for key in keys:  # a section, or a key of one (safe_rl.encoder); or, per params file ({file: [keys]}), the same
            section, *rest = key.split(".")
            model = Config.model_fields[section].annotation
            for part in rest:
                assert part in model.model_fields, (name, key)
                model = model.model_fields[part].annotation
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    assert not names & set(expanded_stages())  # the default pipeline stays without them
    return side


def test_every_command_is_a_registered_stage_with_valid_inputs():
    for name, stage in expanded_stages().items():
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] in stages, name
        entry = stages.entry(argv[1])
        inputs = [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--in"]
        assert set(inputs) <= set(entry.meta["inputs"]), (name, inputs)
        assert "--launcher" in argv and argv[argv.index("--launcher") + 1] == "dvc"
        out = argv[argv.index("--out") + 1]
        for declared in stage.get("outs", []) + [next(iter(m)) if isinstance(m, dict) else m for m in stage.get("metrics", [])]:
            declared = next(iter(declared)) if isinstance(declared, dict) else declared
            assert declared.startswith(out + "/"), (name, declared, out)


def test_params_sections_exist_and_inputs_come_from_upstream_outs():
    sections = set(Config.model_fields)
    every_stage = expanded_stages()
    produced = {o for s in every_stage.values() for o in s.get("outs", [])}
    for name, stage in every_stage.items():
        assert set(stage.get("params", [])) <= sections, name
        for dep in stage.get("deps", []):
            if dep.startswith("outputs/"):
                assert dep in produced, (name, dep)


def test_rl_stage_resumes_under_dvc():
    assert "--resume" in shlex.split(expanded_stages()["rl"]["cmd"])
