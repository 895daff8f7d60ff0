"""examples/smollm2 (what `make run` runs): import -> data -> rl, the checkpoint and the result evaluated, every
stage's settings valid, and the optional SFT warm-up of its params file too. The run itself is the real checkpoint's (minutes): tests/smoke/test_real_checkpoint.py covers its parts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import yaml
from helpers import REPO

EXAMPLE = REPO / "examples" / "smollm2"


def _stages() -> dict[str, dict]:
    return yaml.safe_load((EXAMPLE / "dvc.yaml").read_text())["stages"]


def _inputs(cmd: str) -> dict[str, str]:
    words = shlex.split(cmd)
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--in")


def test_rl_starts_from_the_imported_checkpoint_and_both_are_evaluated():
    stages = _stages()
    assert "sft" not in stages  # `make run` shows what RL does: the SFT warm-up is one command away (params.yaml)
    assert _inputs(stages["rl"]["cmd"])["policy"] == "${out}/import" and "${out}/import/model" in stages["rl"]["deps"]
    for name in ("eval", "eval_arithmetic"):
        assert stages[name]["matrix"]["model"] == ["import", "rl"]
    assert "--answer-format" in stages["problems"]["cmd"]  # the `worked` column an SFT warm-up reads


def test_every_stage_of_the_example_validates_its_settings(tmp_path):
    from posttrain import resolve

    (tmp_path / "model").mkdir()  # model.path must exist; the import's output stands in
    subprocess.run([sys.executable, str(REPO / "examples/word_problems/generate.py"), "--out", str(tmp_path), "--n-train", "20",
                    "--n-heldout", "10", "--answer-format", "#### {answer}"], check=True, capture_output=True)
    files = [f"task.options.dataset.path={tmp_path}/train.jsonl", f"task.options.dataset.heldout_path={tmp_path}/heldout.jsonl"]
    for stage in _stages().values():
        words = shlex.split(stage["cmd"].replace("${arithmetic}", "--set task.name=reasoning_gym"))
        if words[0] != "posttrain":
            continue
        sets = [w for i, w in enumerate(words) if i and words[i - 1] == "--set"]
        sets = [re.sub(r"\$\{out\}/import/model", str(tmp_path / "model"), s) for s in sets]
        cfg = resolve.load(EXAMPLE / "params.yaml", [*files, *sets], stage=words[1])
        if words[1] == "rl":
            assert cfg.rl.lr == 2e-5 and cfg.rl.steps == 20
    # the warm-up the params file documents (not a stage of the example)
    cfg = resolve.load(EXAMPLE / "params.yaml", [*files, f"model.path={tmp_path / 'model'}"], stage="sft")
    assert (cfg.sft.steps, cfg.sft.batch_size, cfg.sft.lr) == (40, 8, 2e-5) and cfg.task.options["dataset"].fields.completion == "worked"


def test_every_stage_that_reads_the_task_runs_after_the_problems_it_names():
    """The params file's dataset options name the problem files, and a stage that reads `task` checks them when it
    loads its settings (even the reasoning-gym one): each must depend, directly or through its inputs, on `problems`,
    or dvc may run it first on a fresh clone ("data file not found")."""
    stages = _stages()
    producer = {out: name for name, stage in stages.items() for out in stage.get("outs", [])}

    def upstream(name: str) -> set[str]:
        found = set()
        for dep in stages[name].get("deps", []):
            owner = next((producer[o] for o in producer if dep == o or dep.startswith(o + "/")), None)
            if owner is not None and owner != name:
                found |= {owner} | upstream(owner)
        return found

    readers = [name for name, stage in stages.items() if any("task" in sections for entry in stage.get("params", []) for sections in entry.values())]
    assert {"data", "data_arithmetic", "rl", "eval", "eval_arithmetic"} <= set(readers)
    for name in readers:
        assert "problems" in upstream(name), name
