"""`make run` (the real checkpoint's pipeline, examples/smollm2) and `make run-tiny` (the tiny one of dvc.yaml) print a
progress line per stage and the summary; dvc's own chatter goes to the log (the recipe, with stand-ins for dvc and
posttrain that print what they print)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from helpers import REPO

DVC_OUTPUT = """Running stage 'data':
> posttrain data --out outputs/data
{"rows": 120}
Stage 'sft' didn't change, skipping
Running stage 'eval@rl':
> posttrain eval --in model=outputs/rl --out outputs/eval/rl
Updating lock file 'dvc.lock'

To track the changes with git, run:

\tgit add dvc.lock

To enable auto staging, run:

\tdvc config core.autostage true
Use `dvc push` to send your updates to remote storage.
"""


def _make_run(tmp_path: Path, dvc_exit: int, target: str = "run-tiny", dvc_output: str = DVC_OUTPUT) -> subprocess.CompletedProcess:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    for name in ("pyproject.toml", "constraints.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / ".dvc").mkdir()
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "dvc-output.txt").write_text(dvc_output)
    stand_ins = {
        "dvc": f'#!/bin/bash\necho "dvc $*" > {tmp_path}/dvc-args.txt\ncat {tmp_path}/dvc-output.txt\necho "a warning" >&2\nexit {dvc_exit}\n',
        "posttrain": '#!/bin/bash\necho "held-out greedy accuracy: SFT 10.0% -> RL 20.0% (+10.0 points) [$*]"\n',
        "python": "#!/bin/bash\necho 3.5\n",
    }
    for name, text in stand_ins.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "venv" / ".installed-run").touch()  # newer than pyproject.toml: `install` has nothing to do
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(["make", "-s", target, "VENV=venv"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_make_run_prints_a_line_per_stage_and_the_summary_without_dvc_advice(tmp_path):
    result = _make_run(tmp_path, 0)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0] == "dvc repro: the pipeline of dvc.yaml (full log: outputs/make-run.log)"
    assert [line.split("]", 1)[1].split() for line in lines[1:4]] == [["data", "running"], ["sft", "unchanged", "(cached)"], ["eval@rl", "running"]]
    assert lines[4].startswith("held-out greedy accuracy: SFT 10.0% -> RL 20.0%") and "--wall-seconds 3.5" in lines[4]
    assert len(lines) == 5 and "git add" not in result.stdout + result.stderr and "dvc push" not in result.stdout + result.stderr
    log = (tmp_path / "outputs/make-run.log").read_text()
    assert "git add dvc.lock" in log and "a warning" in log and '{"rows": 120}' in log  # kept, in the log


def test_a_failed_dvc_repro_shows_the_log_tail_and_exits_non_zero(tmp_path):
    result = _make_run(tmp_path, 3)
    assert result.returncode != 0
    assert "dvc repro failed (exit 3); full log: outputs/make-run.log" in result.stdout
    assert "held-out greedy accuracy" not in result.stdout  # no summary of a run that did not finish


def test_make_run_runs_the_real_checkpoints_pipeline(tmp_path):
    output = DVC_OUTPUT.replace("'data'", "'examples/smollm2/dvc.yaml:data'").replace("'sft'", "'examples/smollm2/dvc.yaml:import'")
    result = _make_run(tmp_path, 0, "run", output.replace("'eval@rl'", "'examples/smollm2/dvc.yaml:eval@import'"))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0] == "dvc repro: the pipeline of examples/smollm2/dvc.yaml (full log: outputs/make-run.log)"
    assert [line.split("]", 1)[1].split()[0] for line in lines[1:4]] == ["data", "import", "eval@import"]
    assert (tmp_path / "dvc-args.txt").read_text().split() == ["dvc", "repro", "examples/smollm2/dvc.yaml"]
    assert "--start import --eval-dir" in lines[4] and "--via" not in lines[4] and "--eval-dir outputs/smollm2/eval_arithmetic" in lines[4] and "--wall-seconds 3.5" in lines[4]
