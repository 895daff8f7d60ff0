"""Mistakes a user can make, across stages and data files. Each must end with exit code 2 and ONE line on stderr
naming the file or key, write nothing to `--out` (no output, no staging `.<out>.partial`), and leave a previous
output at `--out`, and every input, byte-identical.

Every case runs `posttrain.cli.main` in this process (a subprocess spends ~9 s importing torch; `main` is the
code that turns a `UserError` into the line and the exit code, so the guarantee is the same), once over a
previous output at `--out` and once with `--out` absent. A sample also runs as a real subprocess with MLflow
on: only a fresh process shows what is printed once per process (a warning) or by a logger bound to the real
stderr, and what a failed tracked run prints (each case here passes that way too; two keep it checked, at ~15 s
a process). The cases' bad files are damaged copies of a good upstream output,
built once per session (`pipeline_outputs`; the image inputs below).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import built_once, micro_params, posttrain

IMAGE_SIZES = {"flow": {"image_size": 8, "block_channels": [8, 16], "text_dim": 16}}
GOOD = {"prompt": "12+34=", "completion": "46", "answer": "46"}
PAIR = {"prompt": "12+34=", "chosen": "46", "rejected": "47"}


class Case(NamedTuple):
    args: list[str]  # the command line after `posttrain`, without --out
    needles: list[str]  # what the one line must say
    setup: Callable[[Path], object] | None = None  # damages a copy of a good input in the work dir


# ---- the setups: each damages a copy of a good input under work/bad, or writes a bad file ------------------

Setup = Callable[[Path], object]


def copy_of(work: Path, source: str) -> Path:
    return Path(shutil.copytree(work / source, work / "bad"))


def damaged(source: str, file: str, damage: Callable[[Path], object] | None = None) -> Setup:
    """work/bad = a copy of the good output at `source`; `damage` (default: cut in half) its `file`."""
    return lambda work: (damage or truncate)(copy_of(work, source) / file)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def without(column: str) -> Callable[[Path], None]:
    return lambda path: pd.read_parquet(path).drop(columns=[column]).to_parquet(path, index=False)


def images(count: int) -> Callable[[Path], None]:
    return lambda path: np.savez_compressed(path, images=np.zeros((count, 4, 8, 8, 3), np.uint8))


def encoded(line: dict | str | bytes) -> bytes:
    """One JSON line: an object as JSON, text as UTF-8, bytes as they are (to write what is not UTF-8)."""
    if isinstance(line, dict):
        line = json.dumps(line)
    return (line if isinstance(line, bytes) else line.encode()) + b"\n"


def lines_at(at: int, *lines: dict | str | bytes) -> Callable[[Path], None]:
    """Replace the lines of a file from line `at` on by `lines`."""
    def damage(path: Path) -> None:
        rows = path.read_bytes().splitlines(keepends=True)
        rows[at - 1 : at - 1 + len(lines)] = map(encoded, lines)
        path.write_bytes(b"".join(rows))

    return damage


def bad_data(file: str, *lines: dict | str | bytes, at: int = 1) -> Setup:
    return damaged("outputs/data", file, lines_at(at, *lines))


def bad_model(file: str, damage: Callable[[Path], object] | None = None) -> Setup:
    """work/bad = a copy of the SFT output, `file` of its model/ damaged."""
    return damaged("outputs/sft", f"model/{file}", damage)


def pairs_file(*lines: dict | str | bytes) -> Setup:
    return lambda work: (work / "pairs.jsonl").write_bytes(b"".join(map(encoded, lines)))


def problems_file(name: str, *bad: dict) -> Setup:
    """A researcher's problems (task.name dataset): two good rows, then `bad`, as JSON lines or Parquet."""
    rows = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?", "answer": "6"}, *bad]
    if name.endswith(".parquet"):
        return lambda work: pd.DataFrame(rows).to_parquet(work / name, index=False)
    return lambda work: (work / name).write_bytes(b"".join(map(encoded, rows)))


def params_with(section: str, **values) -> Setup:
    def setup(work: Path) -> None:
        params = yaml.safe_load((work / "params.yaml").read_text())
        params[section].update(values)
        (work / "params.yaml").write_text(yaml.safe_dump(params))

    return setup


SFT_BAD_DATA, RL_BAD_DATA, FLOW_SFT_BAD_DATA = ["sft", "--in", "data=bad"], ["rl", "--in", "data=bad"], ["flow_sft", "--in", "data=bad"]
EVAL_BAD_MODEL = ["eval", "--in", "data=outputs/data", "--in", "model=bad"]
RL_BAD_POLICY = ["rl", "--in", "policy=bad"]
PREFERENCE_PAIRS = ["preference", "--set", "preference.pairs=pairs.jsonl"]
CURATE_BAD_SOURCE = ["curate", "--in", "source=bad"]
DATASET = ["data", "--set", "task.name=dataset", "--set", "task.options.dataset.path=problems.jsonl"]
LONG = "1" * 30 + "+" + "2" * 29 + "="  # 61 characters: fits 64 positions, not with 6 more to generate

CASES: dict[str, Case] = {
    # ---- params: rejected at the config boundary, before any work
    "params/unknown-key": Case(["rl", "--set", "rl.lrr=0.1"], ["rl.lrr", "did you mean 'rl.lr'"]),
    "params/unknown-section": Case(["sft", "--set", "optimizer.lr=0.1"], ["optimizer"]),
    "params/unknown-key-in-file": Case(["sft"], ["sft.lrr", "did you mean 'sft.lr'"], params_with("sft", lrr=0.1)),
    "params/wrong-type": Case(["rl", "--set", "rl.steps=abc"], ["rl.steps", "integer"]),
    "params/out-of-range": Case(["rl", "--set", "rl.steps=-3"], ["rl.steps", "greater than 0"]),
    "params/nan": Case(["sft", "--set", "sft.lr=.nan"], ["sft.lr", "finite"]),
    "params/negative-reward-weight": Case(["rl", "--set", "rl.rewards=[{name: correctness, weight: -1}]"], ["rl.rewards.0.weight", "greater than or equal to 0"]),
    "params/infinite-in-file": Case(["rl"], ["rl.lr", "finite"], params_with("rl", lr=float("inf"))),
    "params/unknown-advantage": Case(["rl", "--set", "rl.advantage=grpoo"], ["rl.advantage", "grpoo", "did you mean 'grpo'"]),
    "params/unknown-loss": Case(["rl", "--set", "rl.loss=clipp"], ["rl.loss", "clipp", "clip"]),
    "params/unknown-reward": Case(["rl", "--set", "rl.rewards=[{name: corectness}]"], ["corectness", "correctness"]),
    "params/bad-set-syntax": Case(["rl", "--set", "rl.steps"], ["--set", "section.key=value"]),
    "params/unparsable-value": Case(["rl", "--set", "rl.steps=[1"], ["rl.steps", "cannot parse"]),
    "params/missing-file": Case(["rl", "--params", "nope.yaml"], ["params file not found", "nope.yaml"]),
    "params/invalid-yaml": Case(["rl", "--params", "broken.yaml"], ["broken.yaml", "YAML"],
                                lambda work: (work / "broken.yaml").write_text("rl: [unclosed\n")),
    "params/heads-do-not-divide": Case(["sft", "--set", "model.heads=3"], ["heads"]),
    "params/missing-model-path": Case(["sft", "--set", "model.path=./no-such-model"], ["model.path", "no-such-model"]),
    "params/missing-pairs-file": Case(["preference", "--set", "preference.pairs=nope.jsonl"], ["preference.pairs", "nope.jsonl"]),
    "params/missing-edits-file": Case(["edit", "--set", "edit.edits=nope.jsonl"], ["edit.edits", "nope.jsonl"]),
    "params/bt-reward-without-reward-model": Case(["rl", "--set", "rl.rewards=[{name: bt}]", "--set", "rl.options.bt.path=nothing_here"],
                                                  ["rl.options.bt.path", "reward_model"]),
    "cli/unknown-stage": Case(["trian"], ["trian"]),
    "cli/unknown-option": Case(["sft", "--epochs", "3"], ["--epochs"]),
    "cli/resume-not-resumable": Case(["data", "--resume"], ["'data' cannot --resume"]),
    # ---- --in: rejected before the stage runs
    "in/missing-dir": Case(["rl", "--in", "policy=no/such/dir"], ["'policy'", "no/such/dir"]),
    "in/missing-required-file": Case(["eval", "--in", "model=outputs/data"], ["outputs/data/model/config.json"]),
    "in/unknown-name": Case(["eval", "--in", "teacher=outputs/sft"], ["'teacher'", "takes data, model"]),
    "in/bad-uri-scheme": Case(["sft", "--in", "data=gs://bucket/data"], ["gs://bucket/data", "s3://"]),
    "in/not-name-equals-dir": Case(["sft", "--in", "outputs/data"], ["--in", "name=DIR"]),
    "in/no-train-jsonl": Case(SFT_BAD_DATA, ["bad/train.jsonl"], damaged("outputs/data", "train.jsonl", Path.unlink)),
    # ---- data files: JSON lines, read by the stage (line numbers are exact)
    "data/malformed-json": Case(RL_BAD_DATA, ["bad/train.jsonl:201", "not valid JSON"],
                                bad_data("train.jsonl", '{"prompt": "12+3=", "completion": ', at=201)),
    "data/wrong-type": Case(SFT_BAD_DATA, ["bad/train.jsonl:1", "string fields"], bad_data("train.jsonl", {**GOOD, "answer": 46})),
    "data/missing-field": Case(["eval", "--in", "data=bad", "--in", "model=outputs/sft"], ["bad/heldout.jsonl:3", "expected an object"],
                               bad_data("heldout.jsonl", {"prompt": "1+2="}, at=3)),
    "data/not-utf8": Case(SFT_BAD_DATA, ["bad/train.jsonl:3", "not UTF-8", "byte 13"],
                          bad_data("train.jsonl", b'{"prompt": "\xff1+1=", "completion": "2", "answer": "2"}', at=3)),
    "data/empty-file": Case(SFT_BAD_DATA, ["bad/train.jsonl", "no examples"], damaged("outputs/data", "train.jsonl", emptied)),
    "data/empty-prompt": Case(RL_BAD_DATA, ["bad/train.jsonl:2", "empty prompt"], bad_data("train.jsonl", {**GOOD, "prompt": " "}, at=2)),
    "data/overlong-prompt-sft": Case(SFT_BAD_DATA, ["bad/train.jsonl row 4", "the SFT row", "64 positions"],
                                     bad_data("train.jsonl", {**GOOD, "prompt": LONG + LONG}, at=4)),
    "data/overlong-prompt-rl": Case(RL_BAD_DATA, ["bad/train.jsonl row 1", "rl.max_new_tokens", "64 positions"],
                                    bad_data("train.jsonl", {**GOOD, "prompt": LONG})),
    "data/overlong-prompt-eval": Case(["eval", "--in", "data=bad", "--in", "model=outputs/sft"],
                                      ["bad/heldout.jsonl row 2", "eval.max_new_tokens", "64 positions"],
                                      bad_data("heldout.jsonl", {**GOOD, "prompt": LONG}, at=2)),
    "data/oov-task-alphabet": Case(SFT_BAD_DATA, ["bad/train.jsonl row 5", "'x'", "outside the tokenizer's vocabulary"],
                                   bad_data("train.jsonl", {**GOOD, "prompt": "12x34="}, at=5)),
    "data/oov-completion": Case(SFT_BAD_DATA, ["bad/train.jsonl row 1", "'O'"], bad_data("train.jsonl", {**GOOD, "completion": "4O"})),
    "data/oov-pretrained-tokenizer": Case(RL_BAD_DATA, ["bad/train.jsonl row 1", "'×'", "'é'"],
                                          bad_data("train.jsonl", {**GOOD, "prompt": "12×34=é"})),
    "data/oov-model-path": Case(["sft", "--in", "data=bad", "--set", "model.path=outputs/sft/model"], ["bad/train.jsonl row 1", "' '"],
                                bad_data("train.jsonl", {**GOOD, "prompt": "12 + 34 ="})),
    "data/task-too-small": Case(["data", "--set", "task.digits=1"], ["task.n_train", "1-digit"]),
    # ---- your own data (task.name dataset), read by the data stage: its row suite names file and row
    "dataset/missing-field": Case(DATASET, ["problems.jsonl:3", "field 'answer' is missing"], problems_file("problems.jsonl", {"prompt": "1+1?"})),
    "dataset/wrong-type": Case(DATASET, ["problems.jsonl:3", "field 'prompt' must be a string, got number"],
                               problems_file("problems.jsonl", {"prompt": 12, "answer": "12"})),
    "dataset/empty-answer": Case(DATASET, ["problems.jsonl:4", "field 'answer' is empty"],
                                 problems_file("problems.jsonl", {"prompt": "What is 0+0?", "answer": "0"}, {"prompt": "What is 1+0?", "answer": " "})),
    "dataset/empty-answer-parquet": Case(["data", "--set", "task.name=dataset", "--set", "task.options.dataset.path=problems.parquet"],
                                         ["problems.parquet row 3", "field 'answer' is empty"],
                                         problems_file("problems.parquet", {"prompt": "What is 1+0?", "answer": ""})),
    "dataset/missing-column": Case([*DATASET, "--set", "task.options.dataset.fields.prompt=problem"],
                                   ["task.options.dataset.fields.prompt", "no column 'problem' in problems.jsonl"], problems_file("problems.jsonl")),
    # ---- model directories, as an input or as model.path
    "model/truncated-safetensors": Case(EVAL_BAD_MODEL, ["bad/model/model.safetensors is truncated"], bad_model("model.safetensors")),
    "model/zero-length-safetensors": Case(RL_BAD_POLICY, ["bad/model/model.safetensors is truncated", "header too small"],
                                          bad_model("model.safetensors", emptied)),
    "model/no-weights": Case(EVAL_BAD_MODEL, ["bad/model", "model.safetensors"], bad_model("model.safetensors", Path.unlink)),
    "model/missing-tokenizer-json": Case(EVAL_BAD_MODEL, ["no tokenizer in bad/model", "tokenizer.json"],
                                         bad_model("tokenizer.json", Path.unlink)),
    "model/truncated-tokenizer-json": Case(RL_BAD_POLICY, ["bad/model/tokenizer.json is truncated"], bad_model("tokenizer.json")),
    "model/truncated-config-json": Case(EVAL_BAD_MODEL, ["bad/model/config.json"], bad_model("config.json")),
    "model/missing-config-json": Case(RL_BAD_POLICY, ["'policy'", "bad/model/config.json is missing"],
                                      bad_model("config.json", Path.unlink)),
    "model/path-missing-config-json": Case(["sft", "--set", "model.path=bad/model"], ["no config.json", "bad/model"],
                                           bad_model("config.json", Path.unlink)),
    "model/path-truncated-safetensors": Case(["sft", "--set", "model.path=bad/model"], ["bad/model/model.safetensors is truncated"],
                                             bad_model("model.safetensors")),
    # ---- preference pairs (preference.pairs, reward_model.pairs)
    "pairs/same-text": Case(PREFERENCE_PAIRS, ["pairs.jsonl:2", "same text"], pairs_file(PAIR, {**PAIR, "rejected": "46"})),
    "pairs/missing-field": Case(PREFERENCE_PAIRS, ["pairs.jsonl:2", "missing field 'rejected'"],
                                pairs_file(PAIR, {"prompt": "1+1=", "chosen": "2"})),
    "pairs/unknown-field": Case(["reward_model", "--set", "reward_model.pairs=pairs.jsonl"], ["pairs.jsonl:1", "unknown field 'label'"],
                                pairs_file({**PAIR, "label": 1}, PAIR)),
    "pairs/bad-severity": Case(PREFERENCE_PAIRS, ["pairs.jsonl:1", "severity"], pairs_file({**PAIR, "severity": 2}, PAIR)),
    "pairs/not-utf8": Case(PREFERENCE_PAIRS, ["pairs.jsonl:2", "not UTF-8"],
                           pairs_file(PAIR, b'{"prompt": "1+1=", "chosen": "2", "rejected": "\xc3("}')),
    "pairs/too-few": Case(PREFERENCE_PAIRS, ["pairs.jsonl", "at least 2 pairs"], pairs_file(PAIR)),
    "pairs/oov": Case([*PREFERENCE_PAIRS, "--set", "eval.n_prompts=2"], ["preference data", "'x'"],
                      pairs_file(PAIR, {**PAIR, "rejected": "4x"})),
    # ---- the image pipeline's inputs: the city's tables (curate), curated data and flow models (flow stages)
    "images/curate-no-tiles": Case(CURATE_BAD_SOURCE, ["'source'", "bad/tiles.parquet is missing"],
                                   damaged("outputs/images/city", "tiles.parquet", Path.unlink)),
    "images/truncated-panoramas": Case(CURATE_BAD_SOURCE, ["curate: cannot read bad/panoramas.parquet"],
                                       damaged("outputs/images/city", "panoramas.parquet")),
    "images/panoramas-without-column": Case(CURATE_BAD_SOURCE, ["panoramas.parquet lacks column(s) capture_date"],
                                            damaged("outputs/images/city", "panoramas.parquet", without("capture_date"))),
    "images/truncated-quadruplets": Case(FLOW_SFT_BAD_DATA, ["bad/quadruplets.parquet", "cannot read"],
                                         damaged("outputs/images/curate", "quadruplets.parquet")),
    "images/quadruplets-without-column": Case(FLOW_SFT_BAD_DATA, ["bad/quadruplets.parquet", "lacks column(s) instruction"],
                                              damaged("outputs/images/curate", "quadruplets.parquet", without("instruction"))),
    "images/images-do-not-match-rows": Case(["flow_rl", "--in", "data=bad"], ["bad/images.npz", "do not match the table's 4"],
                                            damaged("outputs/images/curate", "images.npz", images(3))),
    "images/damaged-images": Case(FLOW_SFT_BAD_DATA, ["cannot read bad/images.npz"], damaged("outputs/images/curate", "images.npz")),
    "images/truncated-flow-policy": Case(["flow_rl", "--in", "policy=bad"], ["bad/model/unet/diffusion_pytorch_model.safetensors"],
                                         damaged("outputs/images/flow_sft", "model/unet/diffusion_pytorch_model.safetensors")),
    "images/truncated-flow-path": Case(["flow_sft", "--set", "flow.path=bad/model"], ["bad/model/text_proj.safetensors is truncated"],
                                       damaged("outputs/images/flow_sft", "model/text_proj.safetensors")),
}
SUBPROCESS = ["model/truncated-safetensors", "data/oov-pretrained-tokenizer"]  # a model loads (or fails to), a tracked run fails


# ---- the work directory ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def image_inputs(tmp_path_factory) -> Path:
    """A small synthetic city, a small curate output (4 quadruplets, 8 px) and a tiny saved flow model: inputs
    the image stages read without complaint."""

    def build(root: Path) -> None:
        from posttrain import resolve
        from posttrain.recipes.image.vigor.synthetic import write_city
        from posttrain.recipes.image.flow import build_flow_model

        (root / "city").mkdir()
        write_city(root / "city", n_locations=20, n_cities=1, image_size=32, seed=0)
        (root / "curate").mkdir()
        table = pd.DataFrame({"split": ["train", "train", "heldout", "heldout"], "region": ["left", "right", "centre", "none"],
                              "instruction": ["add a tree"] * 4, "change": ["vegetation"] * 4})
        table.to_parquet(root / "curate" / "quadruplets.parquet", index=False)
        images(4)(root / "curate" / "images.npz")
        cfg = resolve.load(micro_params(root, **IMAGE_SIZES))
        build_flow_model(cfg.flow, 8).save(root / "flow_sft" / "model")

    return built_once(tmp_path_factory, "bad-inputs-images", build)


@pytest.fixture
def work(pipeline_outputs, image_inputs, tmp_path) -> Path:
    """Good upstream outputs at their default places, and `prev`: a previous good output (an SFT model)."""
    for stage in ("data", "sft"):
        shutil.copytree(pipeline_outputs / "outputs" / stage, tmp_path / "outputs" / stage)
    for stage in ("city", "curate", "flow_sft"):
        shutil.copytree(image_inputs / stage, tmp_path / "outputs" / "images" / stage)
    shutil.copytree(pipeline_outputs / "outputs" / "sft", tmp_path / "prev")
    micro_params(tmp_path, tracking={"enabled": False}, **IMAGE_SIZES)
    return tmp_path


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under root (hidden ones included), files with their content hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def prepared(work: Path, name: str, out: str) -> tuple[list[str], dict[str, str]]:
    case = CASES[name]
    if case.setup is not None:
        case.setup(work)
    return [*case.args, "--out", out], snapshot(work)


def assert_one_line(code: int, stdout: str, stderr: str, needles: list[str]) -> None:
    """Exit code 2, stderr exactly one line (no blank line, no warning, no progress bar), stdout empty."""
    assert code == 2 and len(stderr.splitlines()) == 1, (code, stderr[-3000:])
    assert stdout == "", stdout[-3000:]
    line = stderr.strip()
    assert line.startswith("posttrain: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)


def assert_untouched(work: Path, out: str, before: dict[str, str]) -> None:
    assert not (work / f".{out}.partial").exists() and not (work / f".{out}.old").exists()
    assert (work / out).exists() == (out == "prev")
    assert snapshot(work) == before, "a failed run changed files (its --out, an input, or a stray file)"


def main_in_process(args: list[str], monkeypatch, capfd) -> tuple[int, str, str]:
    from posttrain.cli import main

    monkeypatch.setattr(sys, "argv", ["posttrain", *args])
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    captured = capfd.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.mark.parametrize("out", ["prev", "absent"])
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name, out, work, monkeypatch, capfd):
    monkeypatch.chdir(work)
    args, before = prepared(work, name, out)
    assert_one_line(*main_in_process(args, monkeypatch, capfd), CASES[name].needles)
    assert_untouched(work, out, before)


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> Path:
    """One MLflow store for the subprocess cases: creating a store costs seconds, once is enough."""
    return tmp_path_factory.mktemp("bad-inputs-mlflow")


@pytest.mark.parametrize("name", SUBPROCESS)
def test_bad_input_through_the_installed_cli(name, work, mlflow_store):
    store = {"uri": f"sqlite:///{mlflow_store / 'mlflow.db'}", "artifact_root": str(mlflow_store / "mlartifacts")}
    params_with("tracking", enabled=True, **store)(work)  # MLflow on, as a user runs it; its store is not in the work dir
    args, before = prepared(work, name, "prev")
    result = posttrain(*args, cwd=work, check=False)
    assert_one_line(result.returncode, result.stdout, result.stderr, CASES[name].needles)
    assert_untouched(work, "prev", before)

