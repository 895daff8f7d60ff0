"""dvc.yaml only maps paths and params onto real CLI stages: every command, input and params key exists."""

from __future__ import annotations

import shlex


from helpers import expanded_stages
from posttrain.config import Config
from posttrain.stages import stages


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


def test_every_tracked_params_section_is_written_in_its_file():
    """DVC reads a params file as it is (it does not follow `extends:`): a section a stage tracks but the file leaves to
    the file it extends, or to the settings models' defaults, stops `dvc repro` at that stage ("Parameters 'model'
    are missing from 'examples/smollm2/params.yaml'"). Every dvc.yaml of the repository: root, recipes/, examples/."""
    import re

    import yaml
    from helpers import REPO

    files = [REPO / "dvc.yaml", *sorted(REPO.glob("recipes/*/dvc.yaml")), *sorted(REPO.glob("examples/*/dvc.yaml"))]
    assert len(files) > 5
    for path in files:
        spec = yaml.safe_load(path.read_text())
        variables = {k: v for item in spec.get("vars", []) if isinstance(item, dict) for k, v in item.items()}
        for name, stage in spec["stages"].items():
            root = (path.parent / stage.get("wdir", ".")).resolve()
            for entry in stage.get("params", []):
                for params_file, sections in (entry.items() if isinstance(entry, dict) else [("params.yaml", [entry])]):
                    params_file = re.sub(r"\$\{(\w+)\}", lambda m, known=variables: str(known[m.group(1)]), params_file)
                    written = set(yaml.safe_load((root / params_file).read_text()))
                    missing = {s.split(".")[0] for s in sections} - written
                    assert not missing, f"{path.relative_to(REPO)}: stage {name} tracks {sorted(missing)} of {params_file}, which does not write it"
