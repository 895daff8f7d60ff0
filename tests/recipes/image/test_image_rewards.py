"""IA / BP / QP judges: in [0, 1], and they rank the obvious cases the right way."""

from __future__ import annotations

import torch

from posttrain.recipes.image.vigor.render import slot_mask
from posttrain.recipes.image.rewards import EditBatch, image_reward_matrix, image_rewards
from posttrain.recipes.image.settings import ImageRewardSpec


def edit_batch() -> EditBatch:
    g = torch.Generator().manual_seed(0)
    source = torch.rand(2, 3, 12, 12, generator=g) * 0.2 + 0.4
    target = source.clone()
    mask = torch.from_numpy(slot_mask(12, "left")).float()[None, None].repeat(2, 1, 1, 1)
    target = torch.where(mask.bool().expand_as(target), torch.tensor(0.9), target)  # the past: something bright on the left
    return EditBatch(source, target, mask, ("remove the building on the left side",) * 2)


def test_the_target_scores_best_and_a_copy_of_the_source_fails_ia():
    edit = edit_batch()
    ia, bp = image_rewards.get("ia"), image_rewards.get("bp")
    torch.testing.assert_close(ia(edit.target, edit), torch.ones(2))
    assert (ia(edit.source, edit) < 0.15).all()  # 1 - e / (e + 0.05) with e = 0.4
    torch.testing.assert_close(bp(edit.source, edit), torch.ones(2))
    torch.testing.assert_close(bp(edit.target, edit), torch.ones(2))  # the target leaves the background alone
    noisy = edit.target + 0.3 * torch.randn(edit.target.shape, generator=torch.Generator().manual_seed(1))
    assert (bp(noisy, edit) < bp(edit.target, edit)).all()


def test_qp_punishes_out_of_range_pixels_and_noise():
    edit = edit_batch()
    qp = image_rewards.get("qp")
    clean = qp(edit.target, edit)
    assert (qp(edit.target * 3 - 1, edit) < clean).all()  # saturated
    noisy = edit.target + 0.2 * torch.randn(edit.target.shape, generator=torch.Generator().manual_seed(2))
    assert (qp(noisy.clamp(0, 1), edit) < clean).all()


def test_scores_and_overall_stay_in_the_unit_interval():
    edit = edit_batch()
    wild = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(3)) * 5
    specs = [ImageRewardSpec(name=n, weight=1.0) for n in ("ia", "bp", "qp")]
    for images in (wild, edit.source, edit.target):
        matrix, names, weights = image_reward_matrix(specs, images, edit)
        assert names == ("ia", "bp", "qp") and matrix.shape == (2, 3)
        assert ((matrix >= 0) & (matrix <= 1)).all()
        assert 0 <= float(matrix.mean(dim=1).min()) <= float(matrix.mean(dim=1).max()) <= 1  # overall = mean(IA, BP, QP)


def test_no_change_instructions_judge_the_whole_image():
    edit = edit_batch()
    keep = EditBatch(edit.source, edit.source, torch.zeros_like(edit.edit_mask), ("keep the scene exactly as it is",) * 2)
    torch.testing.assert_close(image_rewards.get("ia")(edit.source, keep), torch.ones(2))
    assert (image_rewards.get("ia")(edit.target, keep) < 1).all()
