"""MLflow tracking: one experiment per pipeline, one run per stage.

Runs are tagged `stage`, `objective`, `git_sha` and `launcher`; params are the flattened config; stages
log per-step metrics, tables, figures and artifacts through the `Tracker` they are handed. With
`tracking.enabled: false` every call is a no-op, so stage code never checks.

The tracking server and the artifact store are services that fail. `check_stores` (what `posttrain preflight`
and every stage run first) finds a dead one in seconds, before any training; requests are bounded (`connect`);
and a store that fails mid-run does not cost the trained model: the `Tracker` keeps what MLflow could not take in
the output (`mlflow_pending/`), and `posttrain relog` sends it later. No credential reaches MLflow, a log line or
a message: `connect` moves those written into URIs to the environment, and params are redacted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from posttrain.config import Config
from posttrain.errors import Terminated, UserError
from posttrain.storage import bound_default_clients, check_s3, split_s3, timeout_s
from posttrain.uris import error_line, redact_uri, split_credentials

PENDING = "mlflow_pending"  # in a stage output whose logging failed: what `posttrain relog` sends to its run


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def resolve_uri(uri: str) -> str:
    """Make a relative `sqlite:///file.db` absolute so the same store is found from any directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def connect(cfg: Config) -> tuple[str, str]:
    """The tracking URI and artifact root as MLflow is given them, and this process set up to reach them.

    Credentials written into either URI move to the environment variables the clients read
    (`MLFLOW_TRACKING_USERNAME`/`_PASSWORD`; `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` for an `s3://` root), so
    they still authenticate but are never part of the experiment location, a run's artifact URI or a message.
    MLflow's HTTP requests get a bounded timeout and few retries (its defaults retry for minutes), unless the
    environment already sets them, and S3 clients get `storage.client_config`."""
    uri, user, password = split_credentials(resolve_uri(cfg.tracking.uri))
    for name, value in (("MLFLOW_TRACKING_USERNAME", user), ("MLFLOW_TRACKING_PASSWORD", password)):
        if value is not None:
            os.environ[name] = value
    root, key, secret = split_credentials(cfg.tracking.artifact_root)
    if root.startswith("s3://"):
        for name, value in (("AWS_ACCESS_KEY_ID", key), ("AWS_SECRET_ACCESS_KEY", secret)):
            if value is not None:
                os.environ[name] = value
        bound_default_clients()
    for name, value in (("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, round(timeout_s())))), ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1"),
                        ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")):
        os.environ.setdefault(name, value)
    return uri, root


def check_tracking(uri: str) -> list[str]:
    """Problems with the tracking store at `uri` (given without credentials), as short sentences."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s()) as response:
                return [] if response.status == 200 else [f"MLflow at {uri} answered {response.status}"]
        except (urllib.error.URLError, OSError) as e:
            return [f"MLflow at {uri} is not reachable ({getattr(e, 'reason', e)})"]
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).resolve().parent
        return [] if folder.is_dir() and os.access(folder, os.W_OK) else [f"MLflow store folder {folder} is missing or read-only"]
    return []


def check_stores(cfg: Config, s3_uris: tuple[str, ...] = ()) -> list[str]:
    """Problems with the tracking store, the artifact root's bucket and `s3_uris`, as short sentences (empty:
    ready); each request within the bounded time, so a dead or frozen endpoint is found in seconds."""
    buckets = []
    problems = []
    if cfg.tracking.enabled:
        uri, root = connect(cfg)
        problems += check_tracking(uri)
        buckets = [f"s3://{split_s3(root)[0]}"] if root.startswith("s3://") else []
    return problems + check_s3(buckets + list(s3_uris))


class Tracker:
    """What a stage logs through; backed by the active MLflow run (or nothing).

    Metric points are buffered and sent as one batch every few seconds and at the end: one bounded request, not
    one per step, so a frozen tracking server costs one timeout. A logging call that fails (a store down, or too
    slow: requests are bounded) does not fail the stage, since the trained model is worth more than its log: the
    first failure is kept in `failure`, nothing more is sent, and that call and every later one are kept in `spool`
    (the output's `mlflow_pending/`) for `posttrain relog`. On a reopened run (`--resume`), points at or below the
    last step MLflow holds for a metric are dropped, so the steps redone since the last checkpoint are not logged twice.
    """

    FLUSH_EVERY_S = 5.0

    def __init__(self, mlflow_module=None, run_id: str | None = None, logged_steps: Mapping[str, int] | None = None,
                 root: Path | None = None):
        self._mlflow = mlflow_module
        self.run_id = run_id
        self._logged_steps = dict(logged_steps or {})
        self.root = root  # the output directory; kept calls and their files are relative to it
        self.failure: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._points: list[dict[str, Any]] = []  # metric points not sent yet
        self._flushed_at = time.monotonic()
        self._worked = False

    @property
    def spool(self) -> Path | None:
        return None if self.root is None else self.root / PENDING

    @property
    def worked(self) -> bool:
        """Whether the stage logged anything (a metric, a table, a figure, a text, an artifact) beyond the params."""
        return self._worked

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._worked = self._worked or bool(metrics)
        fresh = {k: float(v) for k, v in metrics.items() if step is None or step > self._logged_steps.get(k, -1)}
        if self._mlflow and fresh:
            self._points.append({"metrics": fresh, "step": step or 0, "timestamp": int(time.time() * 1000)})
            if time.monotonic() - self._flushed_at >= self.FLUSH_EVERY_S:
                self.flush()

    def flush(self) -> None:
        """Send the buffered metric points, in batches of MLflow's limit of 1000 metrics per request."""
        points, self._points, self._flushed_at = self._points, [], time.monotonic()
        if self._mlflow and points:
            Metric = self._mlflow.entities.Metric  # noqa: N806
            batch = [Metric(key, value, p["timestamp"], p["step"]) for p in points for key, value in p["metrics"].items()]
            client = self._mlflow.MlflowClient()
            send = lambda: [client.log_batch(self.run_id, metrics=batch[i : i + 1000]) for i in range(0, len(batch), 1000)]  # noqa: E731
            self._send("log_metrics", send, lambda: {"points": points})

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        if self._mlflow and rows:
            columns = {key: [row[key] for row in rows] for key in rows[0]}
            self._send(f"log_table {artifact_file}", lambda: self._mlflow.log_table(columns, artifact_file=artifact_file),
                       lambda: {"table": self._kept_file(f"tables/{artifact_file}", lambda p: p.write_text(json.dumps(rows, default=str))),
                                "artifact_file": artifact_file})

    def log_figure(self, figure, artifact_file: str) -> None:
        if self._mlflow:
            self._send(f"log_figure {artifact_file}", lambda: self._mlflow.log_figure(figure, artifact_file),
                       lambda: self._kept_artifact(artifact_file, figure.savefig))

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._mlflow:
            self._send(f"log_text {artifact_file}", lambda: self._mlflow.log_text(text, artifact_file),
                       lambda: self._kept_artifact(artifact_file, lambda path: path.write_text(text)))

    def log_artifacts(self, local_dir: Path, artifact_path: str) -> None:
        if self._mlflow:
            files = lambda: [[self._relative(f), _parent(f"{artifact_path}/{f.relative_to(local_dir).as_posix()}")]  # noqa: E731
                             for f in sorted(Path(local_dir).rglob("*")) if f.is_file()]
            self._send(f"log_artifacts {artifact_path}", lambda: self._mlflow.log_artifacts(str(local_dir), artifact_path),
                       lambda: {"files": files()})
            if artifact_path == MODEL_ARTIFACT and is_language_model(Path(local_dir)):
                self.log_text(mlmodel_text(self.run_id), f"{MODEL_ARTIFACT}/MLmodel")  # the files above are its data

    def set_tags(self, **tags: str) -> None:
        """Set (or overwrite) tags of the run, e.g. a stage whose objective differs from the rl section's."""
        if self._mlflow:
            self._send("set_tags", lambda: self._mlflow.set_tags(tags), lambda: {"tags": tags})

    def replay(self, item: Mapping[str, Any]) -> None:
        """Send one call kept in the spool (by `posttrain relog`)."""
        if "points" in item:
            self._points += item["points"]
        elif "table" in item:
            self.log_table(json.loads((self.root / item["table"]).read_text()), item["artifact_file"])
        elif "files" in item:
            files = item["files"]
            upload = lambda: [self._mlflow.log_artifact(str(self.root / local), folder or None) for local, folder in files]  # noqa: E731
            self._send("log_artifacts", upload, lambda: {"files": files})
        elif "tags" in item:
            self.set_tags(**item["tags"])

    def close(self, status: str) -> None:
        """Send the last metric points, end the run (FAILED if logging failed), keep what MLflow did not take."""
        if not self._mlflow:
            return
        self.flush()
        try:
            self._mlflow.end_run("FAILED" if self.failure else status)
        except Exception as e:
            self.failure = self.failure or f"ending the run failed ({error_line(e)})"
        if self.failure and self.spool is not None:
            self.spool.mkdir(parents=True, exist_ok=True)
            record = {"run_id": self.run_id, "failure": self.failure, "items": self._pending}
            (self.spool / "pending.json").write_text(json.dumps(record, indent=1, default=str) + "\n")

    def _send(self, what: str, call: Callable[[], Any], keep: Callable[[], dict[str, Any]]) -> None:
        """`call()`, until one call has failed; from then on (and for that call) `keep()` the call for relog instead,
        so a dead store costs one bounded wait, not one per call."""
        self._worked = self._worked or what != "set_tags"
        if self.failure is None:
            try:
                call()
                return
            except Exception as e:
                self.failure = f"{what} failed ({error_line(e)})"
        if self.spool is not None:
            self._pending.append(keep())

    def _kept_artifact(self, artifact_file: str, write: Callable[[Path], Any]) -> dict[str, Any]:
        """An artifact made in memory (a figure, a text), written into the spool for relog to upload."""
        return {"files": [[self._kept_file(f"files/{artifact_file}", write), _parent(artifact_file)]]}

    def _kept_file(self, name: str, write: Callable[[Path], Any]) -> str:
        path = self.spool / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        return self._relative(path)

    def _relative(self, path: Path) -> str:
        path = Path(path).resolve()
        root = self.root.resolve() if self.root is not None else None
        return path.relative_to(root).as_posix() if root is not None and path.is_relative_to(root) else str(path)


def _parent(artifact_file: str) -> str:
    return Path(artifact_file).parent.as_posix().removeprefix(".")


def _quiet_mlflow():
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # table-creation chatter on a new store
    return mlflow


def _logged_steps(run_id: str) -> dict[str, int]:
    """The last step MLflow holds for each metric of the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    return {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in client.get_run(run_id).data.metrics}


@contextmanager
def _open_run(cfg: Config, start: Callable[[Any, str], Any], root: Path | None) -> Iterator[Tracker]:
    """A Tracker on the run `start(mlflow, artifact_root)` opens; ended FINISHED, or FAILED if the block raises."""
    mlflow = _quiet_mlflow()
    uri, artifact_root = connect(cfg)
    mlflow.set_tracking_uri(uri)
    try:
        run = start(mlflow, artifact_root)
        logged = _logged_steps(run.info.run_id)
    except UserError:  # a setting the open run cannot honour (a moved artifact root): its own line
        raise
    except Exception as e:  # the stores were checked moments ago; this is one failing now, before any work
        try:
            mlflow.end_run("FAILED")  # a run started before the failure (no-op when none is active)
        except Exception:
            pass  # the store is failing: the line below says so
        raise UserError(f"cannot open the MLflow run at {uri}: {error_line(e)}") from None
    tracker = Tracker(mlflow, run.info.run_id, logged, root)
    try:
        yield tracker
    except BaseException as e:
        tracker.close("KILLED" if isinstance(e, (Terminated, KeyboardInterrupt)) else "FAILED")
        raise
    tracker.close("FINISHED")
    if tracker.failure and tracker.spool is None:  # nowhere to keep the rest: say so
        raise UserError(f"MLflow logging failed: {tracker.failure}")


# --- final models as MLflow models: the logged `model/` folder plus an MLmodel file (pyfunc flavour) ----------------

MODEL_ARTIFACT = "model"
REGISTERED_STAGES = ("rl", "rl_rm", "distill", "preference", "sft")  # registered as posttrain-<stage> at a pipeline run's end


def is_language_model(model_dir: Path) -> bool:
    """A saved transformers causal LM with its tokenizer (what `LanguageModel` loads)."""
    return (model_dir / "config.json").is_file() and any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


def mlmodel_text(run_id: str | None) -> str:
    """The MLmodel file that makes the logged `model/` folder an MLflow model: pyfunc, loaded by this module's
    `_load_pyfunc` from the folder itself, so `mlflow.pyfunc.load_model("models:/posttrain-rl/latest")` works."""
    from mlflow.models import Model
    import mlflow.pyfunc

    model = Model(artifact_path=MODEL_ARTIFACT, run_id=run_id)
    mlflow.pyfunc.add_to_model(model, loader_module="posttrain.tracking", data=".")
    return model.to_yaml()


class LanguageModel:
    """The pyfunc model: `predict(prompts)` -> greedy completions (params: max_new_tokens, default 16). It decodes with
    transformers' own `generate`, not the rollout engine, on purpose: a registered model is served from the logged
    folder as a plain transformers checkpoint, so this checks that it works as one outside posttrain's loops."""

    def __init__(self, path: str):
        from posttrain.models.factory import load_pretrained

        self.model, self.tokenizer = load_pretrained(path)
        self.model.eval()

    def predict(self, model_input, params: Mapping[str, Any] | None = None) -> list[str]:
        import torch

        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else [str(p) for p in model_input]
        completions = []
        for prompt in prompts:
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                out = self.model.generate(ids, max_new_tokens=int((params or {}).get("max_new_tokens", 16)), do_sample=False,
                                          pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
            completions.append(self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        return completions


def _load_pyfunc(data_path: str) -> LanguageModel:  # MLflow's pyfunc loader_module entry point
    return LanguageModel(data_path)


def register_models(cfg: Config, pipeline_run: str) -> list[str]:
    """Register the models the finished runs of `pipeline_run` logged as `posttrain-<stage>` (a version per run),
    tagged with the pipeline run, the stage and the arm; returns `name/version` of each."""
    if not cfg.tracking.enabled:
        return []
    from mlflow.tracking import MlflowClient

    mlflow = _quiet_mlflow()
    uri = connect(cfg)[0]
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.pipeline.name)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], f"tags.pipeline_run = '{pipeline_run}' and attributes.status = 'FINISHED'")
    registered = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        if run.data.tags.get("stage") not in REGISTERED_STAGES or "MLmodel" not in {f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(run.info.run_id, MODEL_ARTIFACT)}:
            continue
        tags = {"pipeline_run": pipeline_run, **{k: run.data.tags[k] for k in ("stage", "arm", "objective") if k in run.data.tags}}
        version = mlflow.register_model(f"runs:/{run.info.run_id}/{MODEL_ARTIFACT}", f"posttrain-{run.data.tags['stage']}", tags=tags)
        registered.append(f"{version.name}/{version.version}")
    return registered


def objective_tags(cfg: Config, rl_objective: bool | None) -> dict[str, str]:
    """`objective` (advantage+loss) and `arm` (the preset, else the advantage: a sweep arm's name) of a run that trains
    with the rl settings: a stage registered with `rl_objective=True`, or an experiment's arm (`None`, not a pipeline
    stage). A stage that does not (data, sft, eval, ...) carries neither: a sweep's data and sft are shared by every
    arm, and an evaluation inherits the tags of the model it evaluates."""
    if rl_objective is False:
        return {}
    return {"objective": f"{cfg.rl.advantage}+{cfg.rl.loss}", "arm": cfg.rl.preset or cfg.rl.advantage}


def _inherited_objective(mlflow, tags: Mapping[str, str]) -> dict[str, str]:
    """An evaluation of an RL model carries the objective and arm of the run that trained it (lineage tag)."""
    made_by = tags.get("input.model.run_id")
    if "objective" in tags or not made_by:
        return {}
    try:
        source = mlflow.get_run(made_by).data.tags
    except Exception:  # a model made under another tracking store: nothing to inherit
        return {}
    return {k: source[k] for k in ("objective", "arm") if k in source}


def run_name(cfg: Config, stage: str, tags: Mapping[str, str], rl_objective: bool | None) -> str:
    """What a run is, for MLflow's lists and legends: `rl grpo+clip seed 0`, `eval rl`, `sft`; an experiment's run
    (`rl_objective` None) is named as its caller named it."""
    if rl_objective:
        label = tags.get("objective", f"{cfg.rl.advantage}+{cfg.rl.loss}")
        if tags.get("arm") and tags["arm"] != cfg.rl.advantage:  # a preset: its name says more than its parts
            label = f"{tags['arm']} ({label})"
        return f"{stage} {label} seed {cfg.pipeline.seed}"
    evaluated = tags.get("input.model.stage")
    if evaluated:
        return f"{stage} {evaluated}" + (f" {tags['arm']}" if tags.get("arm") else "")
    return stage


def pipeline_experiment(mlflow, cfg: Config, root_uri: str) -> str:
    """The id of the experiment `pipeline.name`, created with `root_uri` as its artifact location if there is none. A
    stage that loses the race to create it (stages of one run start together) takes the one the winner made."""
    location = Path(root_uri).resolve().as_uri() if "://" not in root_uri else root_uri
    experiment = mlflow.get_experiment_by_name(cfg.pipeline.name)
    if experiment is None:
        try:
            return mlflow.create_experiment(cfg.pipeline.name, artifact_location=location)
        except Exception:
            experiment = mlflow.get_experiment_by_name(cfg.pipeline.name)
            if experiment is None:
                raise
    if experiment.artifact_location.rstrip("/") != location.rstrip("/"):  # MLflow would keep the old one, silently
        raise UserError(f"experiment {cfg.pipeline.name!r} keeps its artifacts in {redact_uri(experiment.artifact_location)}, not "
                        f"tracking.artifact_root {redact_uri(location)}: set that root back, or a new pipeline.name for the new one")
    return experiment.experiment_id


def prepare_store(cfg: Config) -> None:
    """Create the tracking store and the pipeline's experiment before any stage starts (the launchers' preflight):
    stages that start together on a new SQLite store would otherwise race on creating its tables."""
    if not cfg.tracking.enabled:
        return
    mlflow = _quiet_mlflow()
    uri, artifact_root = connect(cfg)
    mlflow.set_tracking_uri(uri)
    try:
        pipeline_experiment(mlflow, cfg, artifact_root)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot create the MLflow experiment at {uri}: {error_line(e)}") from None


@contextmanager
def stage_run(cfg: Config, stage: str, launcher: str, run_id: str | None = None, extra_tags: Mapping[str, str] | None = None,
              root: Path | None = None, rl_objective: bool | None = None) -> Iterator[Tracker]:
    """Open (or, given `run_id`, reopen) the stage's MLflow run; mark it FAILED if the stage raises. Calls that fail
    are kept under `root` (the stage's output) for `relog`; see `Tracker`. `rl_objective`: whether a pipeline stage
    trains with the rl section's objective (its registry flag); None for a run that is not a pipeline stage's (an
    experiment's arm: tagged with the objective, named `stage`). See `objective_tags` and `run_name`."""
    if not cfg.tracking.enabled:
        yield Tracker()
        return
    tags = {"stage": stage, "git_sha": git_sha(), "launcher": launcher, **objective_tags(cfg, rl_objective)}
    if os.environ.get("POSTTRAIN_PIPELINE_RUN"):  # set by Kubeflow / Airflow: lets their exit task find the runs
        tags["pipeline_run"] = os.environ["POSTTRAIN_PIPELINE_RUN"]
    tags.update(extra_tags or {})

    def start(mlflow, root_uri: str):
        experiment_id = pipeline_experiment(mlflow, cfg, root_uri)
        if run_id is None:
            tags.update(_inherited_objective(mlflow, tags))
        run = mlflow.start_run(run_id=run_id, experiment_id=experiment_id, run_name=None if run_id else run_name(cfg, stage, tags, rl_objective), tags=tags)
        if run_id is None:
            params = [(k, redact_uri(v) if isinstance(v, str) else v) for k, v in flatten(cfg.model_dump(mode="json")).items()]
            for i in range(0, len(params), 90):  # MLflow accepts at most 100 params per batch
                mlflow.log_params(dict(params[i : i + 90]))
        return run

    with _open_run(cfg, start, root) as tracker:
        yield tracker


def relog(cfg: Config, out_dir: Path) -> str:
    """Send what a stage could not log (`out_dir/mlflow_pending/`) into its run and end the run FINISHED; returns
    the run id. What fails again stays kept, for the next try."""
    spool = Path(out_dir) / PENDING
    if not (spool / "pending.json").is_file():
        raise UserError(f"{out_dir} has nothing to re-log (no {spool / 'pending.json'})")
    if not cfg.tracking.enabled:
        raise UserError("tracking.enabled is false: there is no MLflow to re-log into")
    problems = check_stores(cfg)
    if problems:
        raise UserError(f"cannot re-log {out_dir}: " + "; ".join(problems))
    record = json.loads((spool / "pending.json").read_text())
    with _open_run(cfg, lambda mlflow, _: mlflow.start_run(run_id=record["run_id"]), Path(out_dir)) as tracker:
        for item in record["items"]:
            tracker.replay(item)
    if tracker.failure:
        raise UserError(f"re-logging {out_dir} failed again: {tracker.failure}; the rest is kept in {spool}, try again later")
    shutil.rmtree(spool)
    return record["run_id"]


def drop_empty_run(cfg: Config, tracker: Tracker) -> bool:
    """Delete the run of a stage that stopped before any work (a data file's bad rows, a setting refused inside the
    stage): only its params, so an empty FAILED run would be left behind. Best effort: False if nothing was deleted."""
    if not cfg.tracking.enabled or tracker.run_id is None or tracker.worked:
        return False
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(connect(cfg)[0]).delete_run(tracker.run_id)
    except Exception:  # the store is failing: the run stays, FAILED
        return False
    return True


def mark_killed(cfg: Config, run_id: str) -> bool:
    """The run, if still RUNNING, -> KILLED: called for a run recorded in a staging directory whose writer is gone (the
    caller holds the output's lock), which could not end its run itself. Best effort: False if nothing was marked."""
    if not cfg.tracking.enabled:
        return False
    from mlflow.tracking import MlflowClient

    client = MlflowClient(connect(cfg)[0])
    try:
        if client.get_run(run_id).info.status != "RUNNING":
            return False
        client.set_tag(run_id, "failure", "its writer was killed (found RUNNING by the next start of the same output)")
        client.set_terminated(run_id, status="KILLED")
    except Exception:  # a run of another store, or deleted since: nothing to mark
        return False
    return True
