"""VisKG through the core RL step (recipes/viskg/policy.py over rollout/policy.py's `Policy`): the vision-language model
is a `Policy`; its recorded log-probs are the ones the update recomputes (ratio 1 on the first pass); each sample keeps
its own question's image; the three rewards are the reward matrix's columns;
and settings that would read more of the policy than completion log-probs are refused in one line."""

from __future__ import annotations

import pytest
import torch

from posttrain.errors import UserError
from posttrain.recipes.viskg.policy import IMAGES, VisionLanguagePolicy
from posttrain.recipes.viskg.settings import VisKGConfig
from posttrain.recipes.viskg.trainer import build_model, rl_step, rl_trainer
from posttrain.rollout.policy import CausalLMPolicy, Policy
from posttrain.trainers.online_rl import OnlineRL, RLRun


def micro(**rl) -> VisKGConfig:
    return VisKGConfig.model_validate({
        "data": {"grid": 2, "n_objects": 3, "max_hops": 2, "n_train": 24, "n_heldout": 4},
        "model": {"hidden_size": 16, "layers": 1},
        "rl": {"steps": 2, "prompts_per_step": 3, "group_size": 2, "max_new_tokens": 10, **rl},
    })


def test_both_model_kinds_are_policies():
    cfg = micro()
    vlm = build_model(cfg, 0)
    assert isinstance(VisionLanguagePolicy(vlm), Policy) and isinstance(CausalLMPolicy(vlm.language_model, vlm.tokenizer), Policy)


def test_a_step_records_the_log_probs_the_update_recomputes_and_keeps_each_samples_image():
    cfg = micro(dynamic_sampling=True, dynamic_sampling_max_rollouts=2, epochs_per_batch=2, correction="tis")
    vlm = build_model(cfg, 0)
    trainer, examples = rl_trainer(cfg, vlm, 0)
    row = rl_step(cfg, trainer, examples, 0, 1)
    assert row["mismatch/k3"] < 1e-6 and abs(row["mismatch/max_ratio"] - 1) < 1e-3  # KV-cached sampling vs the full forward
    assert {"dynamic_sampling/dropped_groups", "reward/viskg_accuracy_mean", "varied_format", "accuracy", "grad_norm"} <= set(row)
    columns = trainer.run.cfg.rewards
    assert [c.name for c in columns] == ["viskg_accuracy", "viskg_format", "viskg_compactness"] and [c.weight for c in columns] == [1.0, 1.0, 0.5]
    # each sample's image is its own question's (tests/unit/test_anchor_objectives.py: kept groups keep theirs)
    result = trainer.step(examples[:3])
    batch = result.batch
    for i in range(batch.size):
        assert torch.equal(batch.extras[IMAGES][i], result.prompts[int(batch.group[i])].metadata["image"])
    assert float(batch.rewards[:, 0].mean()) == pytest.approx(result.metrics["reward/viskg_accuracy_mean"])


def test_micro_batches_give_the_whole_batch_gradient():
    grads = []
    for micro_batch in (0, 2):
        cfg = micro()
        vlm = build_model(cfg, 0)
        trainer, examples = rl_trainer(cfg, vlm, 0)
        trainer.cfg = trainer.cfg.model_copy(update={"micro_batch": micro_batch})
        batch, _, _ = trainer.rollout(examples[:3])
        trainer.optimizer.zero_grad()
        outputs, backward = trainer.update_forward(batch)
        backward((outputs.logp * batch.completion_mask).sum())
        grads.append(torch.cat([p.grad.flatten() for p in vlm.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


@pytest.mark.parametrize("update,refused", [({"advantage": "remax"}, "greedy_rewards"), ({"sampler": "power"}, "rl.sampler power"),
                                             ({"mode": "async"}, "rl.mode async")])
def test_what_reads_more_than_log_probs_is_refused_in_one_line(update, refused):
    cfg = micro()
    vlm = build_model(cfg, 0)
    trainer, examples = rl_trainer(cfg, vlm, 0)
    run = trainer.run
    with pytest.raises(UserError, match=refused) as error:
        OnlineRL(RLRun(**{**vars(run), "cfg": run.cfg.model_copy(update=update)}))
    assert "\n" not in str(error.value) and "VisionLanguagePolicy gives completion log-probs only" in str(error.value)

