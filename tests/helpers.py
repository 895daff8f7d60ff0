"""Helpers shared by the smoke, integration and orchestration tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))

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


def micro_params(directory: Path, **sections: dict) -> Path:
    """Write the repo's params.yaml, shrunk to micro sizes (plus `sections` overrides), into `directory`."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for name, values in [*MICRO.items(), *sections.items()]:
        params[name] = {**params[name], **values}
    params["tracking"]["uri"] = f"sqlite:///{directory / 'mlflow.db'}"
    params["tracking"]["artifact_root"] = str(directory / "mlartifacts")
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


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
    result = CliRunner().invoke(app, list(args), standalone_mode=False)
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result.output


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
