"""benchmarks/grpo_step.py: its named shapes build what they promise, EOS-off really removes EOS on every side, and
the roofline's FLOP count and the memory poller measure what they say (the timed runs themselves are not tests)."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("grpo_step_bench", REPO / "benchmarks" / "grpo_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_shape_dry_run_builds_the_shape(bench, tmp_path):
    out = tmp_path / "dry.json"
    assert bench.main(["--json", str(out), "--params", str(REPO / "params.yaml"), "--shape", "small", "--dry-run"]) == 0
    summary = json.loads(out.read_text())
    assert summary["dry_run"] and summary["shape"] == "small"
    assert summary["parameters"] >= 4_000_000
    assert summary["max_new_tokens"] >= 96 and summary["eos"] is False and summary["sft_steps"] == 0
    assert summary["rows"] == summary["prompts_per_step"] * summary["group_size"] == 128
    # --set still wins over the shape, and tiny stays today's default (the params.yaml model, EOS on)
    overridden = bench.parse_args(["--json", str(out), "--params", str(REPO / "params.yaml"), "--shape", "small", "--set", "rl.group_size=4"])
    assert bench.load_config(overridden).rl.group_size == 4
    tiny = bench.parse_args(["--json", str(out)])
    assert tiny.shape == "tiny" and tiny.eos is True and tiny.sft_steps == 200 and tiny.steps == 16


def _model(bench, tmp_path):
    from posttrain import resolve

    args = bench.parse_args(["--json", str(tmp_path / "x.json"), "--params", str(REPO / "params.yaml"),
                             "--set", "model.hidden_size=32", "--set", "model.intermediate_size=64"])
    cfg = bench.load_config(args)
    assert isinstance(cfg, type(resolve.load(str(REPO / "params.yaml"), [])))
    return cfg, bench.build(cfg, 0, eos=False)


def test_eos_off_removes_eos_from_sampler_and_training_forward(bench, tmp_path):
    from posttrain.rollout.sampling import encode_prompts, sample

    cfg, (_, train, tokenizer, model) = _model(bench, tmp_path)
    eos = tokenizer.eos_token_id
    with torch.no_grad():  # make EOS the likeliest token everywhere: without the hook rows would end at once
        model.get_output_embeddings().weight[eos] = 50 * model.get_output_embeddings().weight.abs().max()
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in train[:4]], torch.device("cpu"))
    out = sample(model, ids, mask, group_size=2, max_new_tokens=12, eos_id=eos, pad_id=tokenizer.pad_token_id,
                 generator=torch.Generator().manual_seed(0))
    assert int(out.completion_mask.sum()) == 8 * 12 and not bool(out.finished.any())
    assert not bool((out.completion_ids == eos).any())
    logits = model(input_ids=ids, attention_mask=mask).logits  # the training forward (and TRL's, and generate's)
    assert torch.all(logits[..., eos] == bench.EOS_LOGIT)
    assert torch.isfinite(torch.log_softmax(logits, -1)).all()


def test_rollout_flops_by_hand(bench, tmp_path):
    cfg, (_, _, tokenizer, model) = _model(bench, tmp_path)
    h, inter, layers, vocab = 32, 64, cfg.model.layers, len(tokenizer)
    kv = h // cfg.model.heads * cfg.model.kv_heads
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter  # q, o, k, v; gate, up, down
    assert bench.linear_parameters(model) == layers * per_layer + vocab * h  # + the tied LM head
    # 3 rows x 2 new tokens after 5 prompt positions attend to 6 and 7 positions
    expected = 3 * (2 * bench.linear_parameters(model) * 2 + 4 * layers * h * (6 + 7))
    assert bench.rollout_flops(model, 5, 2, 3) == expected


def test_rss_watch_sees_an_allocation(bench):
    watch = bench.RssWatch()
    try:
        with watch.call("big"):
            x = torch.ones(4_000_000)  # 16 MB, touched
            time.sleep(0.2)  # alive for 100 of the poller's 2 ms periods: seen even when a loaded machine delays its thread
            del x
        with watch.call("none"):
            pass
        assert watch.peak_mib("big") > 10
        assert watch.peak_mib("none") < 2
    finally:
        watch.close()


def test_smollm2_shape_has_the_real_checkpoints_size_and_vocabulary(bench, tmp_path):
    """SmolLM2-135M-Instruct's shape, randomly initialised: 134,515,008 parameters (the real checkpoint's count) and
    the 49,152-token head, from a character tokenizer padded with filler characters that no prompt contains."""
    out = tmp_path / "dry.json"
    assert bench.main(["--json", str(out), "--params", str(REPO / "params.yaml"), "--shape", "smollm2", "--dry-run"]) == 0
    summary = json.loads(out.read_text())
    assert summary["parameters"] == 134_515_008 and summary["model"]["arch"] == "llama" and summary["model"]["layers"] == 30
    filler = bench.filler_characters(100, "abc\ue000")
    assert len(set(filler)) == 100 and "\ue000" not in filler


def test_gpu_summary_reads_the_recorded_run(tmp_path, capsys):
    """benchmarks/gpu_summary.py turns the first H200 run's files (benchmarks/results/gpu_h200_*) into docs/speed.md's table."""
    import shutil
    import subprocess
    import sys

    for shape in ("anchor", "smollm2"):
        shutil.copy(REPO / "benchmarks" / "results" / f"gpu_h200_grpo_{shape}.json", tmp_path / f"grpo_{shape}.json")
    text = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_summary.py"), str(tmp_path)], capture_output=True, text=True,
                          check=True).stdout
    assert "NVIDIA H200" in text and "| anchor |" in text and "| smollm2 |" in text
    assert "121,193" in text and "0.718" in text  # the figures docs/speed.md quotes


def test_both_sides_update_in_the_same_micro_batches(bench, tmp_path):
    """At `--shape smollm2` each side runs an update one group (4 rows) a pass: ours with rl.micro_batch 4, TRL with a
    device batch of 4 and 16 accumulation steps, so it still generates the whole batch of 64 and takes one optimizer
    step per generation; a micro-batch that does not divide the batch is refused."""
    args = bench.parse_args(["--json", str(tmp_path / "x.json"), "--params", str(REPO / "params.yaml"), "--shape", "smollm2"])
    rl = bench.load_config(args).rl
    config = bench.trl_config(rl, seed=0, total_steps=2, out_dir=str(tmp_path / "trl"))
    assert (rl.micro_batch, config.per_device_train_batch_size, config.gradient_accumulation_steps) == (4, 4, 16)
    assert config.generation_batch_size == 64 and config.steps_per_generation == 16
    bench.check_comparable(rl)
    with pytest.raises(SystemExit, match="must divide the batch"):
        bench.check_comparable(rl.model_copy(update={"micro_batch": 5}))
