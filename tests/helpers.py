"""Helpers shared by the smoke, integration and orchestration tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))
BIN = Path(sys.executable).parent
REPRO_STDOUT = Path(".dvc/tmp/first-repro.txt")  # in the dvc_repro_run fixture: what its `dvc repro` printed


def load_by_path(name: str, path: Path):
    """A module loaded from its file (experiments/ and docs/ are no packages), registered under `name` in sys.modules
    (its dataclasses look their module up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tool_env(**extra: str) -> dict[str, str]:
    """This environment's tools (dvc, posttrain, airflow) first on PATH; `posttrain` found on PATH is the warm one
    (tests/warm_cli.py: the same CLI, forked from a server that has imported it; `POSTTRAIN_WARM=0` for the real
    script). A path to the script (`POSTTRAIN`) is always the real one."""
    import warm_cli

    return {**os.environ, "PATH": f"{warm_cli.shim_dir()}:{BIN}:{os.environ['PATH']}", **extra}


def dvc(*args: str, cwd: Path) -> str:
    """Run this environment's `dvc`; its stdout (a failure shows the tail of both streams)."""
    result = subprocess.run([str(BIN / "dvc"), *args], cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def git(*args: str, cwd: Path) -> None:
    identity = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@localhost", "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@localhost"}
    subprocess.run(["git", *args], cwd=cwd, env=tool_env(**identity), check=True, capture_output=True, timeout=60)


def ran_stages(output: str) -> set[str]:
    """The stages a `dvc repro` ran, by their names in its output (a stage of another dvc.yaml keeps its prefix)."""
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}

MICRO = {
    "task": {"n_train": 200, "n_heldout": 40},
    "model": {"hidden_size": 32, "intermediate_size": 64, "layers": 1},
    "sft": {"steps": 30, "batch_size": 32, "n_examples": 0, "log_every": 10, "warmup_steps": 2},
    "rl": {"steps": 4, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 2, "warmup_steps": 0},
    "eval": {"n_prompts": 40, "batch_size": 40, "n_table": 5},
    "distill": {"steps": 2, "prompts_per_step": 4},
}


# smaller than MICRO still: these tests check wiring and equality across launchers, not learning
TINY = {
    "task": {"n_train": 120, "n_heldout": 20},
    "sft": {"steps": 10, "batch_size": 16, "n_examples": 0, "log_every": 5, "warmup_steps": 1},
    "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 1, "warmup_steps": 0},
    "eval": {"n_prompts": 20, "batch_size": 20, "n_table": 2},
    "distill": {"steps": 2, "prompts_per_step": 2},
}

# micro sections of the other stages (merged over params.yaml's by micro_params, one level deep); reward_model, preference:
MICRO_PAIRS = {"n_pairs": 40, "n_heldout_pairs": 12, "steps": 3, "batch_size": 8, "log_every": 1, "warmup_steps": 0}
MICRO_TRM = {"pairwise_reward": "pd_grpo", "warmup_rubric": "preferred", "rl_steps": 2, "pairs_per_step": 2, "group_size": 2,
             "max_new_tokens": 24, "temperature": 1.0, "lr": 1.0e-4, "alpha_format": 0.5, "score_max": 10}  # reward_model.options.trm
MICRO_EDIT = {
    "facts": {"n_subjects": 4, "relations": 2, "objects_per_relation": 3, "seed": 0},
    "pretrain": {"steps": 3, "batch_size": 8, "lr": 0.003, "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "n_examples": 0,
                 "log_every": 1, "checkpoint_every": 0},
    "n_edits": 2, "steps_per_edit": 1, "log_every": 1,
}
MICRO_CARE = {"n_sft": 30, "n_preference": 20, "n_heldout": 10, "sft_steps": 3, "batch_size": 8, "rl_steps": 2,
              "rl_prompts_per_step": 4, "rl_group_size": 2, "log_every": 1, "warmup_steps": 0}
MICRO_CRITIC = {"n_prompts": 8, "samples_per_prompt": 2, "n_heldout_prompts": 4, "steps": 6, "batch_size": 8, "warmup_steps": 1,
                "log_every": 2}  # critic (recipes/rfpo): RFPO's success critic
MICRO_IMAGE = {
    "city": {"n_locations": 60, "n_cities": 2, "image_size": 32},
    "flow": {"image_size": 8, "block_channels": [8, 16], "text_dim": 16},
    "flow_sft": {"steps": 4, "batch_size": 8, "log_every": 2, "warmup_steps": 0},
    "flow_rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "sampling_steps": 3, "checkpoint_every": 1},
    "flow_eval": {"sampling_steps": 3, "n_prompts": 3, "samples_per_prompt": 1, "n_grid": 2},
}


CHAT_ARCHS = ("qwen2", "llama")
CHAT_SYSTEM = "You add numbers."


def save_chat_checkpoint(directory: Path, arch: str, seed: int = 0) -> Path:
    """A tiny real-shaped checkpoint in `directory`: a byte-level BPE tokenizer with Qwen2's special tokens and a
    Qwen2-style chat template (models.tokenizer.train_bpe_tokenizer), and a 2-layer, hidden-32 Qwen2 or Llama model
    with random weights, both written by `save_pretrained`, to be loaded back by path (`model.path`)."""
    import random

    import torch

    from posttrain.models import build_tiny, save_pretrained, train_bpe_tokenizer
    from posttrain.resolve import load

    rng = random.Random(seed)
    sums = [f"{a:02d}+{b:02d}={a + b}" for a, b in ((rng.randrange(100), rng.randrange(100)) for _ in range(400))]
    corpus = [*sums, "system user assistant", CHAT_SYSTEM, "<answer> </answer> -*0123456789"]
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=320)
    sizes = ["model.hidden_size=32", "model.intermediate_size=64", "model.layers=2", "model.heads=4", "model.kv_heads=2",
             "model.max_positions=128", f"model.arch={arch}"]
    torch.manual_seed(seed)
    model = build_tiny(load(REPO / "params.yaml", sizes).model, tokenizer)
    save_pretrained(model, tokenizer, directory)
    return directory


def save_llava_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A tiny native vision-language checkpoint in `directory`, shaped like the real ones (recipes/viskg/native_vlm.py's
    `tiny_llava`): a LlavaForConditionalGeneration (2-layer CLIP vision tower at 16 px, 8 px patches; 2-layer, hidden-32
    Llama text model) with random weights, and its LlavaProcessor (CLIP image processor, a byte-level BPE tokenizer
    learnt from VisKG's texts with the `<image>` token added, a chat template), all written by `save_pretrained`."""
    import torch

    from posttrain.recipes.viskg import data as D
    from posttrain.recipes.viskg.native_vlm import tiny_llava

    qs = D.questions(seed, 200, 3, 4, 3)
    corpus = [q.text for q in qs] + [D.target(q, kind) for q in qs for kind in ("kg", "caption")]
    torch.manual_seed(seed)
    model, processor = tiny_llava(corpus, image_size=16, patch_size=8, hidden_size=32, layers=2, heads=2, vocab_size=500)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def is_verdict(text: str) -> bool:
    """A claims-harness verdict. At micro size (2 seeds) a row reads `too few seeds (...)` where every premise held and
    `premise failed (...)` where one failed (experiments/_premises.MIN_SEEDS are needed); tiny arms can end equal on
    every seed (`identical arms`)."""
    return (text in {"reproduced", "contradicted", "inconclusive", "identical arms"} or text.startswith("premise failed (")
            or text.startswith("too few seeds ("))


def repo_params(path: Path | None = None) -> dict:
    """Every setting of a run of the repo's params.yaml (or `path`) as plain values: the file over the settings
    models' defaults, every component's options block included (the file itself holds only the main knobs)."""
    from posttrain import resolve

    return resolve.load(path or REPO / "params.yaml").model_dump(mode="json")


def micro_params(directory: Path, **sections: dict) -> Path:
    """Write the repo's params.yaml, shrunk to micro sizes (plus `sections` overrides), into `directory`."""
    params = repo_params()
    for name, values in [*MICRO.items(), *sections.items()]:
        params[name] = {**params[name], **values}
    params["tracking"]["uri"] = f"sqlite:///{directory / 'mlflow.db'}"
    params["tracking"]["artifact_root"] = str(directory / "mlartifacts")
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def micro_edits(n: int = 3, size: int = 8, instructions: tuple[str, ...] | None = None):
    """`n` random CrossTimeEdit quadruplets at `size` (images in [-1, 1], the edit region the left three columns): the
    flow_rl tests' training edits."""
    import torch

    from posttrain.recipes.image.vigor.edits import Edits

    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 4, 3, size, size, generator=g) * 2 - 1
    mask = torch.zeros(n, 1, size, size)
    mask[..., :3] = 1
    return Edits(images[:, 0], images[:, 1], images[:, 1:].reshape(n, 9, size, size), mask,
                 instructions or ("remove the tree on the left side",) * n, ("vegetation",) * n)


FORK_SAFE = {"pipeline": {"device": "cpu", "threads": 1}, "tracking": {"enabled": False}}  # see _kill_a_fork


def micro_rl_parts(directory: Path, overrides: list[str], n_examples: int):
    """(cfg, task, train examples, tokenizer, starting state dict, model) of a random micro policy on the micro
    config with `overrides`: for tests that drive `OnlineRL` in this process."""
    import torch

    from posttrain import resolve
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    cfg = resolve.load(micro_params(directory), overrides)
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    return cfg, task, task.splits(0)["train"][:n_examples], tokenizer, {k: v.clone() for k, v in model.state_dict().items()}, model


def fork_safe_params(directory: Path, **sections: dict) -> Path:
    """micro_params for stages run in this process and in forks of it (kill_resume_and_compare(in_process=True))."""
    return micro_params(directory, **{**FORK_SAFE, **sections})


def tiny_params(directory: Path, **sections: dict) -> Path:
    return micro_params(directory, **{**TINY, **sections})


def posttrain(*args: str, cwd: Path, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the installed `posttrain` CLI as a user would."""
    result = subprocess.run([POSTTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"posttrain {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def posttrain_in_process(*args: str) -> str:
    """The `posttrain` CLI in this process (a subprocess spends seconds importing torch per call); its output."""
    from typer.testing import CliRunner

    from posttrain.cli import _register_stage_commands, app

    _register_stage_commands()
    saved = dict(os.environ)  # restored: MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI, which would reach every
    try:  # later subprocess of this pytest worker (another test's dvc or posttrain command, logging to this test's store)
        result = CliRunner().invoke(app, list(args), standalone_mode=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result.output


def posttrain_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The `posttrain` entry point (`posttrain.cli.main`, what the installed script calls) in this process, with its
    error handling: (exit code, stdout, stderr)."""
    from posttrain.cli import main

    monkeypatch.setattr(sys, "argv", ["posttrain", *args])
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code
    out = capsys.readouterr()
    return code, out.out, out.err


def posttrain_here(*args: str, cwd: Path) -> str:
    """`posttrain_in_process` run from `cwd` (where params.yaml and outputs/ are)."""
    with contextlib.chdir(cwd):
        return posttrain_in_process(*args)


WALL_CLOCK = {"tokens_per_s", "step_seconds", "seconds_per_step", "panoramas_per_second"}  # differ between equal runs


def deterministic(rows):
    """A metrics dict, or a history (list of them), without its wall-clock keys."""
    if isinstance(rows, list):
        return [deterministic(row) for row in rows]
    return {k: v for k, v in rows.items() if k not in WALL_CLOCK}


def _kill_a_subprocess(stage: str, args: list[str], cwd: Path, checkpoints: Path, kill_at: int) -> None:
    """The installed CLI, SIGKILLed from here once checkpoint `kill_at` is in `checkpoints` (somewhere after it)."""
    proc = subprocess.Popen([POSTTRAIN, stage, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while not (checkpoints / f"step-{kill_at:06d}").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be interrupted"


def _kill_a_fork(stage: str, args: list[str], cwd: Path, checkpoints: Path, kill_at: int) -> None:
    """The CLI in a fork of this process (no interpreter start), which SIGKILLs itself the moment checkpoint
    `kill_at` is durable in `checkpoints`: no race with the end of a short run. Its settings must be FORK_SAFE: a fork
    may not use CUDA, an OpenMP pool its parent started, nor MLflow's connections of the parent."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1), os.dup2(null, 2)
            from posttrain.trainers import loop

            save = loop.save_checkpoint

            def save_then_die(directory, step, *rest, **kwargs):
                path = save(directory, step, *rest, **kwargs)
                if step == kill_at and Path(directory).resolve() == checkpoints.resolve():
                    os.kill(os.getpid(), signal.SIGKILL)
                return path

            loop.save_checkpoint = save_then_die
            posttrain_here(stage, *args, cwd=cwd)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the run was not killed at {checkpoints.name}/step-{kill_at:06d} (exit status {status}: it finished or failed first)")


@contextlib.contextmanager
def steps_taken(into: list[Path | None]):
    """Record the checkpoint folder of the loop of every optimiser step taken in this process."""
    from posttrain.trainers.loop import TrainLoop

    step = TrainLoop.optimizer_step

    def recorded(loop, *args, **kwargs):
        into.append(loop.checkpoint_dir and Path(loop.checkpoint_dir).resolve())
        return step(loop, *args, **kwargs)

    TrainLoop.optimizer_step = recorded
    try:
        yield into
    finally:
        TrainLoop.optimizer_step = step


def kill_resume_and_compare(straight: Path, resumed: Path, stage: str, args: list[str], kill_at: int, checkpoints: str = "checkpoints",
                            in_process: bool = False, finished: str | None = None, resumed_steps: int | None = None) -> list[dict]:
    """Run `stage` (the CLI with `args`) straight through in one directory; in the other, SIGKILL it once checkpoint
    `kill_at` is in its staging directory's `checkpoints` folder, then `--resume`: every weight file, the history
    and the metrics (but wall-clock keys) must be equal and no staging directory may be left. `in_process`: the runs
    use the CLI in this process and the killed one a fork of it (seconds of imports saved per run); `finished`
    (in_process only): the checkpoint folder of a phase that ended before the kill, whose loop the resumed run must
    not step again. Returns the straight run's history ([] for a stage that writes none)."""
    run = posttrain_here if in_process else posttrain
    run(stage, *args, cwd=straight)
    staging = resumed / "outputs" / f".{stage}.partial"
    (_kill_a_fork if in_process else _kill_a_subprocess)(stage, args, resumed, staging / checkpoints, kill_at)
    assert sorted((staging / checkpoints).glob("step-*")), "the killed run left no checkpoint"

    with steps_taken([]) if in_process else contextlib.nullcontext([]) as taken:
        run(stage, *args, "--resume", cwd=resumed)
    assert taken or not in_process, "the resumed run took no step"
    # a run that ignored its checkpoint and started again would end equal too (same seed): count what it redid
    assert resumed_steps is None or len(taken) == resumed_steps, f"the resumed run took {len(taken)} steps, not {resumed_steps}"
    if finished:
        assert (staging / finished).resolve() not in taken, f"the resumed run stepped the finished phase ({finished}) again"
    a, b = straight / "outputs" / stage, resumed / "outputs" / stage
    weights = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert weights and weights == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    import torch
    from safetensors.torch import load_file

    for name in weights:
        wa, wb = load_file(a / name), load_file(b / name)
        assert wa.keys() == wb.keys()
        for key in wa:
            assert torch.equal(wa[key], wb[key]), f"{name}: {key} differs after resume"
    history = json.loads((a / "history.json").read_text()) if (a / "history.json").is_file() else []
    if history:
        assert deterministic(history) == deterministic(json.loads((b / "history.json").read_text()))
    metrics_a = json.loads((a / "metrics.json").read_text())
    assert deterministic(metrics_a) == deterministic(json.loads((b / "metrics.json").read_text()))
    assert not staging.exists()
    return history


def copy_repro_run(source: Path, target: Path) -> Path:
    """A writable copy of the dvc_repro_run fixture at `target`: the same outputs, DVC cache and MLflow runs, with
    its params.yaml's tracking.uri moved to the copy's own mlflow.db (so tests that log more runs do not see each
    other's), committed in the copy's Git repository. The artifact root stays the fixture's: it is where the copied runs' artifacts are, and new runs only
    add folders of their own there. `tracking` is no stage's DVC parameter: the copy is up to date."""
    shutil.copytree(source, target, symlinks=True)
    params = target / "params.yaml"
    old, new = f"sqlite:///{source / 'mlflow.db'}", f"sqlite:///{target / 'mlflow.db'}"
    assert old in params.read_text(), f"{params} does not log to {old}"
    params.write_text(params.read_text().replace(old, new))
    git("commit", "-qam", "the copy's own tracking store", cwd=target)  # `dvc exp run` starts from the commit
    return target


def copy_outputs(source: Path, target: Path) -> None:
    shutil.copytree(source / "outputs", target / "outputs")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A read-only directory that `build` fills once per test session, shared by every pytest-xdist worker
    (the workers' temp dirs share a parent; a file lock makes the first worker build and the others wait)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent
    root, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed half-way left this
            root.mkdir()
            build(root)
            done.touch()
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(*buckets: str, port: int | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """A loopback S3 stand-in (moto) on 127.0.0.1 (on `port`, else a free one) with `buckets`, started here and stopped
    by its process id; yields its endpoint and its process (tests freeze it with SIGSTOP)."""
    port = port or free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        import boto3

        for bucket in buckets:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint, server
    finally:
        os.killpg(server.pid, signal.SIGCONT)  # a frozen server cannot act on SIGTERM
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def claim_in_process(monkeypatch, tmp_path: Path, script: str, claim: str, argv: list[str]) -> dict:
    """experiments/`script`.py's one-seed `main` under the claims harness (`run_seeds`) in this process, with its
    experiments cache under `tmp_path`: the claim's results."""
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    monkeypatch.setenv("POSTTRAIN_EXP_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location(f"{script}_smoke", REPO / "experiments" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from _claims import run_seeds

    monkeypatch.setattr(sys, "argv", [f"{script}.py"])
    return run_seeds(module.main, claim, argv, script=str(REPO / "experiments" / f"{script}.py"))


# --- dvc.yaml files, read as the launchers read them ----------------------------------------------------------

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
    """The stages of a pipeline kept out of the default `dvc repro` (recipes/<name>/dvc.yaml), checked: exactly `names`, each
    run from the repository root as a registered CLI stage with its own inputs, outs under its --out, params that
    name settings, deps that exist or come from the file's own outs; none of them in ./dvc.yaml."""
    from posttrain.resolve import all_registries, settings_model

    stages, settings = all_registries()["stages"], settings_model()
    side = expanded_stages(path)
    produced = {o for s in side.values() for o in s.get("outs", [])}
    assert names == set(side)
    for name, stage in side.items():
        assert stage["wdir"] == os.path.relpath(REPO, path.parent), name  # from the repository root
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] == name and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        keys = [k for entry in stage["params"] for k in ([entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks])]
        for key in keys:  # a section, or a key of one (safe_rl.encoder); or, per params file ({file: [keys]}), the same
            section, *rest = key.split(".")
            model = settings.model_fields[section].annotation
            for part in rest:
                assert part in model.model_fields, (name, key)
                model = model.model_fields[part].annotation
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    assert not names & set(expanded_stages())  # the default pipeline stays without them
    return side


def install_plugin(site: Path, module: str, source: str, entry: str) -> None:
    """A plugin package as pip would install it: `module`.py with `source` plus a .dist-info whose entry_points.txt
    names `entry` (`name = module:function`) in the group `posttrain.plugins`; put `site` on PYTHONPATH."""
    info = site / f"{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[posttrain.plugins]\n{entry}\n")
