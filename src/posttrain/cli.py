"""`posttrain <stage> --params params.yaml --set section.key=value --in name=DIR --out DIR`.

One command per registered stage, plus `registry` (every registry and its names) and `summary` (the
end-of-pipeline report). Mistakes a user can make end with one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

try:  # typer vendors its own click since 0.2x
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from posttrain.errors import Terminated, UserError
from posttrain.uris import redact_uri

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=__doc__)

Params = Annotated[Path, typer.Option("--params", help="YAML file with every section's settings.")]
Overrides = Annotated[list[str], typer.Option("--set", help="Override one setting: section.key=value (repeatable).")]
Inputs = Annotated[list[str], typer.Option("--in", help="Input: name=DIR or name=s3://bucket/prefix (repeatable); defaults to outputs/<upstream>.")]


def _input_locations(items: list[str]) -> dict[str, str]:
    parsed = {}
    for item in items:
        name, sep, location = item.partition("=")
        if not sep or not name or not location:
            raise UserError(f"--in expects name=DIR or name=URI, got {item!r}")
        parsed[name] = location
    return parsed


def _parse_inputs(items: list[str]) -> dict[str, Path]:
    """name -> local directory; an `s3://` input is fetched into the input cache first (posttrain.storage)."""
    from posttrain.api import local_inputs

    return local_inputs(_input_locations(items))


def _stage_command(name: str, doc: str):
    def command(
        params: Params = Path("params.yaml"),
        overrides: Overrides = [],  # noqa: B006  (typer reads the default)
        inputs: Inputs = [],  # noqa: B006
        out: Annotated[Path | None, typer.Option("--out", help="Output directory (default outputs/<stage>).")] = None,
        resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint, if any.")] = False,
        launcher: Annotated[str, typer.Option("--launcher", help="Recorded in the MLflow run's tags.")] = "cli",
    ) -> None:
        from posttrain.api import run_stage
        from posttrain.runtime import strict_json

        out_dir = out or Path("outputs") / name
        # the lock first (issue 38): a second writer is refused before the imports, the settings and the store check;
        # `main` may hold it already, and torchrun's other ranks take none (rank 0 alone writes the output)
        metrics = run_stage(name, params, overrides, _input_locations(inputs), out_dir, resume, launcher=launcher,
                            lock=_early_locked != out_dir)
        typer.echo(strict_json(metrics, sort_keys=True))

    app.command(name, help=doc)(command)


_early_locked: Path | None = None  # the output `main` locked before the stage registry was imported


def _early_lock(argv: list[str]):
    """The output lock of `posttrain <stage> --out DIR`, taken before the stage registry (torch, every stage module)
    is imported, so that a second writer is refused in well under a second (issue 38). Other commands, `--help`,
    the default output and torchrun's non-zero ranks: nothing here (the stage command locks as before)."""
    global _early_locked
    import contextlib

    builtin = {command.name for command in app.registered_commands}
    if (len(argv) < 2 or argv[1].startswith("-") or argv[1] in builtin or "--help" in argv
            or os.environ.get("RANK", "0") != "0"):
        return contextlib.nullcontext()
    out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"), None)
    out = out or next((a.split("=", 1)[1] for a in argv if a.startswith("--out=")), None)
    if not out or "://" in out:
        return contextlib.nullcontext()
    from posttrain.locks import OutputLock

    _early_locked = Path(out)
    return OutputLock(_early_locked)


def _register_stage_commands() -> None:
    """Once per process: `main` may run several times in one (the bad-input tests call it in-process)."""
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too
    registered = {command.name for command in app.registered_commands}
    for entry in stages:
        if entry.name in registered:
            continue
        doc = (sys.modules[entry.obj.__module__].__doc__ or "").strip().split("\n\n")[0]
        _stage_command(entry.name, doc)


@app.command("registry")
def registry(as_json: Annotated[bool, typer.Option("--json", help="Print {registry: [names]} as JSON.")] = False) -> None:
    """Print every registry and the names registered in it (a plugin's entries marked with their source)."""
    from posttrain.resolve import all_registries

    registries = all_registries()
    if as_json:
        typer.echo(json.dumps({kind: reg.names() for kind, reg in registries.items()}, indent=2))
        return
    for kind, reg in registries.items():
        names = [f"{e.name} [{e.meta['source']}]" if "source" in e.meta else e.name for e in reg]
        typer.echo(f"{kind}: {', '.join(names)}")


@app.command("summary")
def summary(
    eval_dirs: Annotated[list[Path], typer.Option("--eval-dir", help="An eval output holding <start>/ and <result>/ (repeatable).")] = [],  # noqa: B006
    start: Annotated[str, typer.Option("--start", help="The evaluated starting model's folder: sft, or import (a pretrained checkpoint).")] = "sft",
    result: Annotated[str, typer.Option("--result", help="The evaluated trained model's folder.")] = "rl",
    via: Annotated[list[str], typer.Option("--via", help="An evaluated model between the two, e.g. sft (repeatable, in order).")] = [],  # noqa: B006
    wall_seconds: Annotated[float, typer.Option("--wall-seconds")] = 0.0,
    out: Annotated[Path, typer.Option("--out")] = Path("outputs/summary.json"),
    params: Params = Path("params.yaml"),
) -> None:
    """Print held-out accuracy before and after RL, and of the models in between (per eval output); write summary.json."""
    from posttrain import resolve
    from posttrain.tracking import resolve_uri

    cfg = resolve.load(params)
    eval_dirs = eval_dirs or [Path("outputs/eval")]
    summary: dict[str, object] = {}
    lines = []
    for eval_dir in eval_dirs:
        found = {}
        for name in (start, *via, result):
            path = eval_dir / name / "metrics.json"
            if not path.is_file():
                raise UserError(f"missing {path}: run the pipeline first (dvc repro)")
            found[name] = json.loads(path.read_text())
        prefix = "" if eval_dir == eval_dirs[0] else f"{eval_dir.name}_"
        for name, metrics in found.items():
            summary[f"{prefix}{name}_accuracy"] = metrics["greedy_accuracy"]
            summary[f"{prefix}{name}_sampled_accuracy"] = metrics["sampled_accuracy"]
        before, after = found[start]["greedy_accuracy"], found[result]["greedy_accuracy"]
        groups = sorted(k.removeprefix("greedy_accuracy_") for k in found[result] if k.startswith("greedy_accuracy_") and k in found[start])
        detail = "".join(f"; {g}: {found[start]['greedy_accuracy_' + g]:.1%} -> {found[result]['greedy_accuracy_' + g]:.1%}" for g in groups)
        where = "" if len(eval_dirs) == 1 else f" ({eval_dir})"
        steps = "".join(f"{name.upper()} {found[name]['greedy_accuracy']:.1%} -> " for name in via)
        lines.append(f"held-out greedy accuracy{where}: {start.upper()} {before:.1%} -> {steps}{result.upper()} {after:.1%} "
                     f"({100 * (after - before):+.1f} points){detail}")
    summary["wall_seconds"] = wall_seconds
    summary["outputs"] = str(eval_dirs[0].parent.resolve())
    uri = redact_uri(resolve_uri(cfg.tracking.uri))
    summary["mlflow_ui"] = f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    typer.echo("\n".join(lines) + f"\nwall time: {wall_seconds:.0f} s\noutputs: {summary['outputs']}  (summary: {out})\n"
               f"view the runs (experiment {cfg.pipeline.name!r}): {summary['mlflow_ui']}  then open http://127.0.0.1:5000")


ValuesJson = Annotated[list[str], typer.Option("--values-json", help='JSON object {"section.key": value} or {"section": {...}} (repeatable).')]
PipelineStages = Annotated[list[str], typer.Option(
    "--stage", help="A stage the pipeline runs (repeatable): only the settings sections its stages read are checked (default: every section).")]


@app.command("preflight")
def preflight(
    params: Params = Path("params.yaml"),
    overrides: Overrides = [],  # noqa: B006
    values_json: ValuesJson = [],  # noqa: B006
    inputs: Inputs = [],  # noqa: B006
    stages: PipelineStages = [],  # noqa: B006
    write_config: Annotated[Path | None, typer.Option("--write-config", help="Write the resolved settings (YAML) here.")] = None,
    sweep_arm: Annotated[str, typer.Option("--sweep-arm", help="A sweep arm: a preset (all its rl keys) or an advantage estimator.")] = "",
    sweep_arms: Annotated[str, typer.Option("--sweep-arms", help="A sweep's arms (JSON list): each known, none twice.")] = "",
) -> None:
    """Check a run before any GPU is requested: config, MLflow, S3 credentials and buckets, inputs."""
    from posttrain.orchestration.preflight import config_text, preflight as check, resolve_config
    from posttrain.orchestration.sweep import arm_overrides, check_arms
    from posttrain.tracking import prepare_store

    if sweep_arms:
        try:
            arms = json.loads(sweep_arms)
        except json.JSONDecodeError as e:
            raise UserError(f"--sweep-arms is not JSON: {e.msg}") from None
        if not isinstance(arms, list) or not all(isinstance(a, str) for a in arms):
            raise UserError("--sweep-arms must be a JSON list of names")
        check_arms(arms)
    arm = arm_overrides(sweep_arm) if sweep_arm else []
    cfg = resolve_config(params, values_json, [*overrides, *arm], tuple(stages))
    problems = check(cfg, _input_locations(inputs))
    if problems:
        raise UserError("preflight failed: " + "; ".join(problems))
    prepare_store(cfg)  # once, before the run's stages start together on it
    if write_config is not None:
        write_config.parent.mkdir(parents=True, exist_ok=True)
        write_config.write_text(config_text(cfg))
    objective = f"{cfg.rl.advantage}+{cfg.rl.loss}"
    typer.echo(f"preflight ok: experiment {cfg.pipeline.name!r}, objective {objective}, tracking {redact_uri(cfg.tracking.uri)}")


@app.command("finalize")
def finalize(
    pipeline_run: Annotated[str, typer.Option("--pipeline-run", help="The launcher's run id (tag pipeline_run).")],
    params: Params = Path("params.yaml"),
    values_json: ValuesJson = [],  # noqa: B006
    overrides: Overrides = [],  # noqa: B006
    stages: PipelineStages = [],  # noqa: B006
    status_json: Annotated[str, typer.Option("--status-json", help="Kubeflow's PipelineTaskFinalStatus, as JSON.")] = "",
    state: Annotated[str, typer.Option("--state", help="The pipeline run's final state, when not given by --status-json.")] = "",
    cleanup: Annotated[list[Path], typer.Option("--cleanup", help="Remove half-written stage outputs under DIR.")] = [],  # noqa: B006
    fail_if_failed: Annotated[bool, typer.Option("--fail-if-failed", help="Exit 1 when the state is failed (an Airflow teardown fails its run).")] = False,
) -> None:
    """Mark the pipeline run's MLflow runs that are still RUNNING as FAILED; remove half-written outputs."""
    from posttrain.orchestration.finalize import mark_unfinished_failed, remove_leftovers
    from posttrain.tracking import register_models
    from posttrain.orchestration.preflight import resolve_config

    if not pipeline_run:
        raise UserError("--pipeline-run is empty")
    if status_json:
        status = json.loads(status_json)
        state = status.get("state", state)
        reason = f"pipeline {state}: {status.get('error', {}).get('message', '')}".strip(": ")
    else:
        reason = f"pipeline {state or 'ended'}"
    cfg = resolve_config(params, values_json, overrides, tuple(stages))
    failed = mark_unfinished_failed(cfg, pipeline_run, reason)
    removed = [p for root in cleanup if root.is_dir() for p in remove_leftovers(root)]
    # a run that went through: its final models into the Model Registry (posttrain-<stage>, tagged pipeline_run)
    registered = register_models(cfg, pipeline_run) if state.lower() in ("ended", "succeeded") and not failed else []
    typer.echo(json.dumps({"state": state, "marked_failed": failed, "registered": registered, "removed": [str(p) for p in removed]}, sort_keys=True))
    if fail_if_failed and state.lower() == "failed":
        raise UserError(f"pipeline run {pipeline_run!r} failed: a task failed or was stopped ({len(failed)} MLflow runs marked FAILED)")


@app.command("relog")
def relog(
    out: Annotated[Path, typer.Option("--out", help="The stage output whose logging failed (it has mlflow_pending/).")],
    params: Params = Path("params.yaml"),
    overrides: Overrides = [],  # noqa: B006
) -> None:
    """Send to MLflow what a stage could not log (its output's mlflow_pending/), into the stage's own run."""
    from posttrain import resolve
    from posttrain.tracking import relog as send

    cfg = resolve.load(params, overrides)
    typer.echo(f"re-logged {out} into MLflow run {send(cfg, out)}")


@app.command("trainjob")
def trainjob(
    stage: Annotated[str, typer.Option("--stage", help="The training stage every node runs.")],
    out: Annotated[Path, typer.Option("--out", help="Where the stage output is copied once the TrainJob completes.")],
    spec_out: Annotated[Path, typer.Option("--spec-out", help="Write the rendered TrainJob (YAML) here.")],
    image: Annotated[str, typer.Option("--image", help="The image every node runs.")],
    pipeline_run: Annotated[str, typer.Option("--pipeline-run", help="The pipeline run id (names the TrainJob).")],
    task: Annotated[str, typer.Option("--task", help="The pipeline task (names the TrainJob).")],
    params: Params = Path("params.yaml"),
    inputs: Inputs = [],  # noqa: B006
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint on the shared volume.")] = False,
) -> None:
    """Run a training stage as a Kubeflow Trainer TrainJob (torchrun across nodes) and wait for it."""
    from posttrain.orchestration.trainjob import launch

    typer.echo(launch(stage, params, _parse_inputs(inputs), out, spec_out, image, pipeline_run, task, resume))


@app.command("submit")
def submit(
    host: Annotated[str, typer.Option("--host", help="Kubeflow Pipelines API, e.g. http://localhost:8080")],
    params: Params = Path("params.yaml"),
    overrides: Overrides = [],  # noqa: B006
    package: Annotated[Path, typer.Option("--package", help="Compiled pipeline (make pipelines).")] = Path("pipelines/compiled/text.yaml"),
    experiment: Annotated[str, typer.Option("--experiment", help="Kubeflow experiment (default: pipeline.name).")] = "",
    image: Annotated[str, typer.Option("--image", help="Image for every step (default: orchestration.image).")] = "",
    run_name: Annotated[str, typer.Option("--run-name")] = "",
) -> None:
    """Validate the settings, then submit the compiled pipeline to Kubeflow with them as run parameters."""
    from posttrain.orchestration.submit import submit_run

    typer.echo(submit_run(host, params, overrides, package, experiment, image, run_name))


@contextlib.contextmanager
def _warnings_held():
    """Library warnings raised during a command (PyTorch's lr_scheduler order, a deprecation, ...) wait for its end:
    shown after a run that ends any other way, dropped with a user error, whose stderr is its one line (issue 38)."""
    import warnings

    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    except (UserError, ClickException):
        caught.clear()
        raise
    finally:
        for w in caught:  # to stderr, as Python shows a warning
            sys.stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))


@contextlib.contextmanager
def sigterm_raises():
    """SIGTERM raises `Terminated` in this process's main thread, so a stage unwinds as from Ctrl-C: its MLflow run
    ends KILLED (not left RUNNING), its lock is released, a resumable stage keeps its checkpoints. A forked child
    (a rollout worker) that inherits the handler dies of the signal as before; a TERM that lands in a finaliser is
    raised again after it (`signals.signal_raises`). The old handler is restored after."""
    import signal

    from posttrain.signals import signal_raises

    with signal_raises(signal.SIGTERM, lambda: Terminated("terminated by SIGTERM")):
        yield


def main() -> None:
    global _early_locked
    try:
        with sigterm_raises(), _early_lock(sys.argv), _warnings_held():
            _register_stage_commands()
            app(standalone_mode=False)
    except UserError as e:
        typer.echo(f"posttrain: error: {redact_uri(str(e))}", err=True)
        sys.exit(e.exit_code)
    except ClickException as e:
        typer.echo(f"posttrain: error: {redact_uri(e.format_message())}", err=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except Terminated as e:
        typer.echo(f"posttrain: error: {e} (its MLflow run ends KILLED; a resumable stage goes on from its last checkpoint with --resume)", err=True)
        sys.exit(e.exit_code)
    except Exception:  # a bug: keep its traceback, but not a credential a URI in it may carry
        import traceback

        sys.stderr.write(redact_uri(traceback.format_exc()))
        sys.exit(1)
    finally:
        _early_locked = None


if __name__ == "__main__":
    main()
