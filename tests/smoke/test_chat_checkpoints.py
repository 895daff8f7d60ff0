"""A user's own checkpoint through the pipeline: tiny Qwen2 and Llama saved with a BPE tokenizer and a chat template,
given as `model.path`, run data -> sft -> rl -> eval through the CLI, with the real-model settings on."""

from __future__ import annotations

import json

import pytest

from helpers import CHAT_SYSTEM, micro_params, posttrain_in_process

FEW = {
    "task": {"n_train": 40, "n_heldout": 8},
    "sft": {"steps": 3, "batch_size": 8, "log_every": 1, "warmup_steps": 0},
    "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 0, "max_new_tokens": 6, "stop": ["9="]},
    "eval": {"n_prompts": 8, "batch_size": 8, "n_table": 2, "max_new_tokens": 6, "stop": ["9="]},
    "tracking": {"enabled": False},
}
SETTINGS = {  # one arch per combination, so both paths run without doubling the time
    "qwen2": {"autocast": "bf16", "gradient_checkpointing": False, "lora": {"r": 4}},
    "llama": {"autocast": "none", "gradient_checkpointing": True, "max_prompt_tokens": 24},
}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_own_checkpoint_runs_sft_rl_eval(arch, chat_checkpoints, tmp_path, monkeypatch):
    from posttrain.models import load_pretrained

    lora = {"r": 0, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    model = {**SETTINGS[arch], "path": str(chat_checkpoints[arch]), "system_prompt": CHAT_SYSTEM, "lora": {**lora, **SETTINGS[arch].get("lora", {})}}
    micro_params(tmp_path, **FEW, model=model)
    monkeypatch.chdir(tmp_path)
    for stage in ("data", "sft", "rl", "eval"):
        posttrain_in_process(stage)
    outputs = tmp_path / "outputs"
    tuned, tokenizer = load_pretrained(outputs / "rl" / "model")
    assert tuned.config.model_type == arch and tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert not any("lora" in name for name, _ in tuned.named_parameters())  # adapters merged on save
    metrics = json.loads((outputs / "eval" / "metrics.json").read_text())
    assert metrics["n_prompts"] == 8 and 0.0 <= metrics["greedy_accuracy"] <= 1.0
    history = json.loads((outputs / "rl" / "history.json").read_text())
    assert len(history) == 2 and all(h["loss"] == h["loss"] for h in history)
    for line in (outputs / "eval" / "samples.jsonl").read_text().splitlines():
        assert "9=" not in json.loads(line)["completion"]  # cut at the stop string


def test_sft_steps_zero_passes_the_checkpoint_through(chat_checkpoints, tmp_path, monkeypatch, capsys):
    """`sft.steps=0` skips fine-tuning: the sft stage's model is the checkpoint at model.path, weight for weight, so the
    pipeline's rl starts from it; without model.path the stage refuses with one line and writes nothing."""
    import torch

    from helpers import posttrain_main

    from posttrain.models import load_pretrained

    micro_params(tmp_path, **{**FEW, "sft": {**FEW["sft"], "steps": 0}}, model={"path": str(chat_checkpoints["llama"]), "system_prompt": CHAT_SYSTEM})
    monkeypatch.chdir(tmp_path)
    posttrain_in_process("data")
    metrics = json.loads(posttrain_in_process("sft").splitlines()[-1])
    assert metrics["steps"] == 0.0
    start, passed = load_pretrained(chat_checkpoints["llama"])[0].state_dict(), load_pretrained(tmp_path / "outputs" / "sft" / "model")[0].state_dict()
    assert set(passed) == set(start) and all(torch.equal(passed[k], start[k]) for k in start)
    micro_params(tmp_path, **{**FEW, "sft": {**FEW["sft"], "steps": 0}})
    code, _, err = posttrain_main(monkeypatch, capsys, "sft", "--out", "outputs/sft_scratch")
    assert code != 0 and err.strip().splitlines()[-1].startswith("posttrain: error: sft.steps=0 passes model.path through")
    assert not (tmp_path / "outputs" / "sft_scratch").exists()


def test_the_heldout_check_during_rl_leaves_training_unchanged(chat_checkpoints, tmp_path, monkeypatch):
    """`rl.eval_every=1`: greedy held-out accuracy at the start and after each step, in the history, heldout_curve.json
    and heldout_accuracy.png; greedy draws no random numbers, so the run trains exactly as without the check."""
    micro_params(tmp_path, **FEW, model={"path": str(chat_checkpoints["qwen2"]), "system_prompt": CHAT_SYSTEM})
    monkeypatch.chdir(tmp_path)
    posttrain_in_process("data")
    plain = f"policy={chat_checkpoints['qwen2']}"
    posttrain_in_process("rl", "--in", plain, "--out", "outputs/plain")
    metrics = json.loads(posttrain_in_process("rl", "--in", plain, "--out", "outputs/checked", "--set", "rl.eval_every=1", "--set", "rl.eval_prompts=4").splitlines()[-1])
    outputs = tmp_path / "outputs"
    curve = json.loads((outputs / "checked" / "heldout_curve.json").read_text())
    assert [c["step"] for c in curve] == [0, 1, 2] and all(c["n_prompts"] == 4.0 and 0.0 <= c["heldout_accuracy"] <= 1.0 for c in curve)
    assert metrics["heldout_accuracy_start"] == curve[0]["heldout_accuracy"] and (outputs / "checked" / "heldout_accuracy.png").is_file()
    checked, plain_history = (json.loads((outputs / run / "history.json").read_text()) for run in ("checked", "plain"))
    assert [h["loss"] for h in checked] == [h["loss"] for h in plain_history] and "heldout_accuracy" in checked[-1]
    assert not (outputs / "plain" / "heldout_curve.json").exists()


def test_own_checkpoint_learns_and_edits_facts_through_its_chat_template(chat_checkpoints, tmp_path, monkeypatch):
    """knowledge (SFT on the fact set) and edit start from `model.path` with the model settings applied: the fact
    prompts go through the chat template with the system turn (the saved model keeps the template)."""
    from helpers import MICRO_EDIT

    from posttrain.models import load_pretrained

    model = {"path": str(chat_checkpoints["qwen2"]), "system_prompt": CHAT_SYSTEM, "autocast": "bf16"}
    micro_params(tmp_path, tracking={"enabled": False}, model=model, edit=MICRO_EDIT)
    monkeypatch.chdir(tmp_path)
    posttrain_in_process("knowledge")
    posttrain_in_process("edit")
    knowledge = json.loads((tmp_path / "outputs" / "knowledge" / "metrics.json").read_text())
    assert knowledge["n_facts"] > 0 and all(0.0 <= v <= 1.0 for k, v in knowledge.items() if k.endswith("template_accuracy"))
    edited, tokenizer = load_pretrained(tmp_path / "outputs" / "edit" / "model")
    assert edited.config.model_type == "qwen2" and tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
