"""MLflow run status across failures: FAILED when the stage raises, KILLED for a writer killed with SIGKILL (found by
the next start of its output), and a `--resume` that reopens its run without logging a step twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest


def client_for(cfg):
    from mlflow.tracking import MlflowClient

    from posttrain.tracking import connect

    return MlflowClient(connect(cfg)[0])


def run_of(out_dir) -> str:
    import json

    return json.loads((out_dir / "mlflow_run.json").read_text())["run_id"]


def test_a_stage_that_raises_leaves_its_run_failed(tmp_path, stand_in_stage):
    from posttrain import stages

    def crash(cfg, inputs, out_dir, tracker, resume=False):
        tracker.log_metrics({"loss": 1.0}, step=1)
        raise RuntimeError("the stage broke")

    cfg = stand_in_stage(crash)
    with pytest.raises(RuntimeError):
        stages.execute("probe", cfg, {}, tmp_path / "out")
    (run,) = client_for(cfg).search_runs([client_for(cfg).get_experiment_by_name(cfg.pipeline.name).experiment_id])
    assert run.info.status == "FAILED"


def test_a_killed_writers_run_is_marked_killed_on_the_next_start(tmp_path, stand_in_stage):
    """What SIGKILL leaves: a RUNNING run whose id is in the staging directory, and a lock file naming a dead pid.
    The writer here is a process that takes the lock and is killed; its run is made as `stage_run` makes one."""
    from posttrain import stages
    from posttrain.errors import UserError

    out = tmp_path / "outputs" / "probe"
    cfg = stand_in_stage(lambda cfg, inputs, out_dir, tracker, resume=False: {"ok": 1.0})
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from posttrain.locks import OutputLock;"
                               "OutputLock(Path(sys.argv[1]), 'posttrain probe').__enter__(); print('locked', flush=True); time.sleep(120)",
                               str(out)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    client = client_for(cfg)
    experiment = client.create_experiment(cfg.pipeline.name, artifact_location=Path(cfg.tracking.artifact_root).resolve().as_uri())
    killed_run = client.create_run(experiment, tags={"stage": "probe"}).info.run_id
    staging = out.parent / ".probe.partial"
    staging.mkdir(parents=True)
    (staging / "mlflow_run_id").write_text(killed_run)

    with pytest.raises(UserError, match="is being written by"):  # its writer is alive: its run is left alone
        stages.execute("probe", cfg, {}, out)
    assert client.get_run(killed_run).info.status == "RUNNING"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)

    assert stages.execute("probe", cfg, {}, out) == {"ok": 1.0}
    assert client.get_run(killed_run).info.status == "KILLED"
    assert client.get_run(run_of(out)).info.status == "FINISHED" and run_of(out) != killed_run


def test_resume_reopens_its_run_and_logs_no_duplicate_metric_points(tmp_path, stand_in_stage):
    """A resumable stage logs steps 1..6, checkpoints at 4 and dies; `--resume` redoes 5..8: each step is logged once."""
    from posttrain import stages

    out = tmp_path / "outputs" / "probe"

    def train(first_step: int, last_step: int, crash: bool):
        def run(cfg, inputs, out_dir, tracker, resume=False):
            for step in range(first_step, last_step + 1):
                tracker.log_metrics({"loss": 1.0 / step, "lr": 0.1}, step=step)
                if step == 4:
                    (out_dir / "checkpoints" / "step-000004").mkdir(parents=True)
            if crash:
                raise RuntimeError("killed after step 6")
            tracker.log_metrics({"final_loss": 0.125})
            return {"final_loss": 0.125}

        return run

    cfg = stand_in_stage(train(1, 6, crash=True), resumable=True)
    with pytest.raises(RuntimeError):
        stages.execute("probe", cfg, {}, out)
    first_run = (out.parent / ".probe.partial" / "mlflow_run_id").read_text()
    cfg = stand_in_stage(train(5, 8, crash=False), resumable=True)
    stages.execute("probe", cfg, {}, out, resume=True)

    client = client_for(cfg)
    assert run_of(out) == first_run and client.get_run(first_run).info.status == "FINISHED"
    for key in ("loss", "lr"):
        steps = sorted(m.step for m in client.get_metric_history(first_run, key))
        assert steps == list(range(1, 9)), (key, steps)
    assert [m.value for m in client.get_metric_history(first_run, "final_loss")] == [0.125]


def test_a_new_artifact_root_for_an_existing_experiment_is_one_line_not_silently_ignored(tmp_path, stand_in_stage):
    """MLflow fixes an experiment's artifact location when it is created; a later run asking for another root would
    put its artifacts in the old one without a word. The stage refuses before it runs, naming both."""
    from posttrain import stages
    from posttrain.errors import UserError

    ran = []
    cfg = stand_in_stage(lambda cfg, inputs, out_dir, tracker, resume=False: ran.append(1) or {})
    stages.execute("probe", cfg, {}, tmp_path / "out")
    moved = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"artifact_root": str(tmp_path / "elsewhere")})})
    with pytest.raises(UserError, match="keeps its artifacts in .*, not tracking.artifact_root .*elsewhere") as error:
        stages.execute("probe", moved, {}, tmp_path / "out2")
    assert len(str(error.value).splitlines()) == 1 and ran == [1] and not (tmp_path / "out2").exists()


def test_a_stop_before_any_work_leaves_no_run_and_one_after_work_stays_failed(tmp_path, stand_in_stage):
    """Issue 38, item 6: a user error raised before the stage logged anything (bad rows, a refused setting) deletes
    its run, which would hold the params and nothing else; one raised after a metric keeps its FAILED run."""
    from posttrain import stages
    from posttrain.errors import UserError

    def refuse(cfg, inputs, out_dir, tracker, resume=False):
        raise UserError("train.jsonl: 3 bad rows")

    cfg = stand_in_stage(refuse)
    with pytest.raises(UserError):
        stages.execute("probe", cfg, {}, tmp_path / "out")
    client = client_for(cfg)
    experiment = client.get_experiment_by_name(cfg.pipeline.name).experiment_id
    assert client.search_runs([experiment]) == []

    def diverge(cfg, inputs, out_dir, tracker, resume=False):
        tracker.log_metrics({"loss": 1.0}, step=1)
        raise UserError("step 2: the loss was not finite")

    stand_in_stage(diverge)
    with pytest.raises(UserError):
        stages.execute("probe", cfg, {}, tmp_path / "out")
    (run,) = client.search_runs([experiment])
    assert run.info.status == "FAILED" and run.data.metrics == {"loss": 1.0}


def test_sigterm_ends_the_run_killed(tmp_path, stand_in_stage):
    """Issue 38, item 6: SIGTERM (the CLI's handler, `sigterm_raises`) unwinds the stage; its run ends KILLED, not
    RUNNING until the next start of that output."""
    import os
    import time

    from posttrain import stages
    from posttrain.cli import sigterm_raises
    from posttrain.errors import Terminated

    def terminated(cfg, inputs, out_dir, tracker, resume=False):
        tracker.log_metrics({"loss": 1.0}, step=1)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises before this ends
        return {}

    cfg = stand_in_stage(terminated)
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with sigterm_raises(), pytest.raises(Terminated):
        stages.execute("probe", cfg, {}, tmp_path / "out")
    assert time.monotonic() - started < 20
    client = client_for(cfg)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.pipeline.name).experiment_id])
    assert run.info.status == "KILLED"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the CLI's for its run only


def test_a_sigterm_that_lands_in_a_finaliser_still_ends_the_command():
    """Python runs the handler wherever the main thread is; inside a `__del__` its exception would be printed and
    dropped and the stage would train on (a CI run did, the TERM landing in a regex object's `__del__`). The dropped
    `Terminated` is raised again once the finaliser has returned; other unraisable exceptions reach the old hook."""
    import os
    import sys
    import time

    from posttrain.cli import sigterm_raises
    from posttrain.errors import Terminated

    ran = []

    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, inside the finaliser
                pass
            ran.append(True)

    hook = sys.unraisablehook
    with sigterm_raises(), pytest.raises(Terminated):
        Finalised()
        time.sleep(10)  # the signal sent again ends this
    assert ran == [] and sys.unraisablehook is hook  # the finaliser was cut short by the first raise

    seen = []
    sys.unraisablehook = seen.append
    try:
        with sigterm_raises():
            class Failing:
                def __del__(self):
                    raise ValueError("not a signal")

            Failing()
        assert [type(info.exc_value) for info in seen] == [ValueError]
    finally:
        sys.unraisablehook = hook


@pytest.mark.slow
def test_sigterm_of_the_cli_ends_its_run_killed_and_keeps_its_checkpoints(sft_workdir):
    """The installed CLI, SIGTERMed mid-run (as a scheduler stops a job): exit 143 with one line, the MLflow run
    KILLED, the checkpoints kept for `--resume`, the output lock released."""
    import time

    from mlflow.tracking import MlflowClient

    from helpers import POSTTRAIN

    proc = subprocess.Popen([POSTTRAIN, "sft", "--set", "sft.steps=100000", "--set", "sft.checkpoint_every=1"], cwd=sft_workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    staging = sft_workdir / "outputs" / ".sft.partial"
    deadline = time.time() + 120
    while not any((staging / "checkpoints").glob("step-*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert err.splitlines()[-1].startswith("posttrain: error: terminated by SIGTERM"), err[-3000:]
    assert "Traceback" not in err
    run_id = (staging / "mlflow_run_id").read_text().strip()
    client = MlflowClient(f"sqlite:///{sft_workdir / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"
    assert any((staging / "checkpoints").glob("step-*")) and not (sft_workdir / "outputs" / ".sft.lock").exists()
