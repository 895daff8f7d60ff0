"""MotionInsight through the core RL step (recipes/motion/policy.py over rollout/policy.py's `Policy`): the evaluator is a
`Policy`; the log-probs recorded while sampling are the ones the update recomputes; the KL term reads the frozen SFT
evaluator through `over` (0 on the first step, positive once the policy moved); each sample keeps its own video; and
the reward matrix's columns are the reward's terms with its weights."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from posttrain.recipes.motion.policy import MAPS, EvaluatorPolicy
from posttrain.recipes.motion.settings import MotionRLConfig, MotionVideoConfig
from posttrain.recipes.motion.trainer import new_evaluator, rl_trainer, tokenizer, video_set
from posttrain.recipes.motion.videos import make_videos
from posttrain.rollout.policy import Policy


def setup(**rl):
    model_cfg = SimpleNamespace(encoder_width=8, soft_tokens=2, hidden_size=16, layers=1, heads=2)
    data = video_set(make_videos(MotionVideoConfig(frames=10, size=16), 6, 0), "motion", 2, tokenizer(), pool=2)
    cfg = SimpleNamespace(track_slots=2, model=model_cfg,
                          rl=MotionRLConfig(steps=3, videos_per_step=3, group_size=2, max_new_tokens=10, lr=0.01, beta=0.05, **rl))
    model = new_evaluator(cfg, "motion", 0)
    return cfg, model, data


def test_the_evaluator_is_a_policy_whose_recorded_log_probs_the_update_recomputes():
    cfg, model, data = setup()
    assert isinstance(EvaluatorPolicy(model), Policy)
    trainer, examples = rl_trainer(cfg, model, data, 0)
    first = trainer.step(examples[:3])
    assert first.metrics["mismatch/k3"] < 1e-6 and abs(first.metrics["mismatch/max_ratio"] - 1) < 1e-3
    assert first.metrics["kl"] < 1e-6  # the reference is the policy as it started
    assert [(c.name, c.weight) for c in trainer.run.cfg.rewards] == [("motion_score_accuracy", 1.0), ("motion_cause_f1", 0.5), ("motion_format", 0.1)]
    for i in range(first.batch.size):
        assert torch.equal(first.batch.extras[MAPS][i], first.prompts[int(first.batch.group[i])].metadata[MAPS])
    second = trainer.step(examples[3:6])
    assert second.metrics["kl"] > 0  # read through EvaluatorPolicy.over(reference), which did not move
    assert all(not p.requires_grad for p in trainer.models["reference"].parameters())
