"""RFPO's critic pretraining (recipes/rfpo/trainer.py) learns to tell solved from failed rollouts from their states, and the
`critic` stage's resume after a kill is a case of tests/reliability/test_resume_all_stages.py."""

from __future__ import annotations

import json

import torch

from helpers import micro_params
from posttrain import resolve
from posttrain.recipes.rfpo.trainer import auc, critic_prompts, state_mask, train_critic
from posttrain.trainers.loop import TrainLoop

CRITIC = {"n_prompts": 40, "samples_per_prompt": 4, "n_heldout_prompts": 20, "steps": 60, "batch_size": 32, "lr": 0.01,
          "warmup_steps": 2, "max_grad_norm": 1.0, "log_every": 20, "checkpoint_every": 0}


def test_state_mask_covers_s0_through_the_last_state():
    attention = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert state_mask(attention).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_auc_counts_ordered_pairs():
    assert auc(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([1.0, 1.0, 0.0])) == 1.0
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])) == 0.5


def test_the_critic_samples_prompts_from_the_whole_split_not_the_sft_examples_at_its_top():
    train = list(range(4000))  # the SFT stage fine-tunes on the first sft.n_examples (500 by default)
    drawn = critic_prompts(train, 500, seed=0)
    assert len(set(drawn)) == 500 and drawn == critic_prompts(train, 500, seed=0) and drawn != critic_prompts(train, 500, seed=1)
    assert 30 < sum(x < 500 for x in drawn) < 100  # about an eighth from the top, as in RL's own prompt draws
    assert critic_prompts(train[:10], 50, seed=0) != train[:10] and sorted(critic_prompts(train[:10], 50, seed=0)) == train[:10]


def test_the_critic_learns_to_predict_success_from_the_rollout(tmp_path):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    cfg = resolve.load(micro_params(tmp_path, critic=CRITIC), ["rl.max_new_tokens=4", "rl.temperature=1.0"])
    task = build_task(cfg.task)

    class EndsInBudget(type(task)):  # a label a random policy hits some of the time, visible in its last state
        def correctness_reward(self, completion, finished, example):
            return float(finished)

    labelled = EndsInBudget(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    policy = build_tiny(cfg.model, tokenizer)
    splits = task.splits(0)
    critic, history, final = train_critic(policy, tokenizer, labelled, splits["train"], splits["heldout"], cfg, 0, TrainLoop(),
                                          on_log=lambda step, m: None)
    assert 0.05 < final["train_success_rate"] < 0.95 and 0.05 < final["heldout_success_rate"] < 0.95  # both labels occur
    assert history[-1]["loss"] < history[0]["loss"]
    assert final["heldout_auc"] > 0.8 and final["heldout_brier"] < final["heldout_brier_base_rate"]
    assert all(p.grad is None for p in policy.parameters())  # the policy is only sampled


def test_critic_pretraining_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run(tmp_path):
    """Through real checkpoint files: 6 steps with checkpoints every 2; a fresh start resumed from the step-2
    checkpoint alone (the labelled rollouts are drawn again from the seeded generator) ends with equal weights and
    history. The SIGKILL between checkpoints is covered by TrainLoop's own kill tests (tests/reliability)."""
    import shutil

    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    small = {**CRITIC, "n_prompts": 8, "samples_per_prompt": 2, "n_heldout_prompts": 4, "steps": 6, "batch_size": 8, "log_every": 2}
    cfg = resolve.load(micro_params(tmp_path, critic=small), ["rl.max_new_tokens=4"])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in build_tiny(cfg.model, tokenizer).state_dict().items()}
    splits = task.splits(0)

    def run(directory, resume):
        torch.manual_seed(0)
        policy = build_tiny(cfg.model, tokenizer)
        policy.load_state_dict(start)
        loop = TrainLoop(directory, "x", 2, resume)
        critic, history, final = train_critic(policy, tokenizer, task, splits["train"], splits["heldout"], cfg, 0, loop, on_log=lambda s, m: None)
        return {k: v.clone() for k, v in critic.state_dict().items()}, history, final

    a, history_a, final_a = run(tmp_path / "a", False)
    shutil.copytree(tmp_path / "a" / "step-000002", tmp_path / "b" / "step-000002")
    b, history_b, final_b = run(tmp_path / "b", True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.dumps(final_a) == json.dumps(final_b) and json.dumps(history_a) == json.dumps(history_b)  # NaN AUC equal too
