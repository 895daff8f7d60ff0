"""A native vision-language checkpoint (a tiny LLaVA saved the way real ones come: model + processor with an image
processor, a BPE tokenizer holding the image token and a chat template) loads by path (`viskg.model.path`) and runs
VisKG's SFT, RL and evaluation through the `VisionLanguage` interface the tiny patch-encoder model implements; the
viskg_rl stage reads it and writes it back in its own format; a bad path or a text-only checkpoint is one line."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import micro_params, save_chat_checkpoint, save_llava_checkpoint

MICRO = ["viskg.data.grid=2", "viskg.data.n_objects=3", "viskg.data.max_hops=1", "viskg.data.n_train=8", "viskg.data.n_heldout=4",
         "viskg.sft.steps=40", "viskg.sft.batch_size=8", "viskg.sft.lr=0.01", "viskg.sft.warmup_steps=0", "viskg.sft.log_every=10",
         "viskg.sft.negatives_per_positive=0", "viskg.rl.prompts_per_step=4", "viskg.rl.group_size=4", "viskg.rl.max_new_tokens=48",
         "viskg.rl.steps=1", "viskg.rl.checkpoint_every=0", "viskg.eval.max_new_tokens=48", "viskg.eval.n_table=2", "viskg.eval.n_images=2"]


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return save_llava_checkpoint(tmp_path_factory.mktemp("llava") / "tiny-llava")


def test_a_native_llava_runs_viskg_sft_rl_and_eval_by_path(llava, tmp_path):
    from posttrain.recipes.viskg.native_vlm import NativeVLM
    from posttrain.recipes.viskg.vlm import VisionLanguage, load_vlm
    from posttrain.resolve import load
    from posttrain.recipes.viskg.stages import run_rl
    from posttrain.tracking import Tracker
    from posttrain.recipes.viskg.trainer import build_model, encode_prompts, rl_step, rl_trainer, split, train_sft

    params = micro_params(tmp_path)
    cfg = load(params, [*MICRO, f"viskg.model.path={llava}"])
    vlm = build_model(cfg.viskg, 0)
    assert isinstance(vlm, NativeVLM) and isinstance(vlm, VisionLanguage)
    qs, images = split(cfg.viskg, 0, heldout=False)
    ids, mask = encode_prompts(vlm, qs[:3], images[:3])
    image_token = vlm.model.config.image_token_id
    assert (ids == image_token).sum(1).tolist() == [4, 4, 4] and (mask[:, -1] == 1).all()  # (16 / 8)^2 patches, left-padded

    history, _ = train_sft(cfg.viskg, vlm, 0)  # SFT lowers the NLL of the targets given the images
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    row = rl_step(cfg.viskg, *rl_trainer(cfg.viskg, vlm, 0), 0, 1)  # the core RL step over the native model
    assert row["varied_format"] > 0 and 0 < row["reward_format"] < 1 and row["advantage_abs"] > 0  # a reward spread to act on

    # greedy sampling with the KV cache picks the argmax of the full forward at every position
    out, kept = vlm.generate(images[:3], ids, mask, 20, 0.0)
    full = torch.cat([mask, kept], 1)
    logits = vlm.model(input_ids=torch.cat([ids, out], 1), attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0),
                       **vlm.pixels(images[:3])).logits
    assert torch.equal(logits[:, ids.shape[1] - 1:-1].argmax(-1)[kept.bool()], out[kept.bool()])
    # the RL step's recorded log-probs are the update's; a sampled image token is a plain token there, as in sampling
    drawn = vlm.sample(images[:3], ids, mask, 8, 1.0, torch.Generator().manual_seed(0))
    assert torch.allclose(vlm.completion_logp(images[:3], ids, mask, drawn.completion_ids, drawn.completion_mask), drawn.logp, atol=1e-5)
    forced = torch.cat([torch.full((3, 1), image_token), drawn.completion_ids], 1)
    assert torch.isfinite(vlm.completion_logp(images[:3], ids, mask, forced, torch.ones_like(forced))).all()

    vlm.save(tmp_path / "sft")  # the viskg_rl stage reads the SFT'd checkpoint by path and writes it back natively (no MLflow here)
    metrics = run_rl(load(params, MICRO), {"model": tmp_path / "sft"}, tmp_path / "outputs" / "viskg_rl", Tracker())
    assert {"accuracy", "format_rate", "train_reward_format"} <= set(metrics)
    saved = tmp_path / "outputs" / "viskg_rl" / "model"
    assert json.loads((saved / "config.json").read_text())["model_type"] == "llava" and (saved / "processor_config.json").is_file()
    reloaded = load_vlm(tmp_path / "sft")
    assert torch.equal(reloaded.encode_prompts([q.text for q in qs[:3]], images[:3])[0], ids)
    assert torch.equal(reloaded.completion_logp(images[:3], ids, mask, out, kept), vlm.completion_logp(images[:3], ids, mask, out, kept))
    assert torch.equal(reloaded.generate(images[:3], ids, mask, 20, 0.0)[0], out)


def test_a_bad_vlm_path_or_a_text_only_checkpoint_is_one_line(llava, tmp_path):
    from posttrain.errors import UserError
    from posttrain.recipes.viskg.vlm import load_vlm
    from posttrain.resolve import load
    from posttrain.recipes.viskg.trainer import build_model

    with pytest.raises(UserError, match="is not a directory"):
        load_vlm(tmp_path / "nowhere")
    with pytest.raises(UserError, match="has neither vlm.json .* nor config.json"):
        load_vlm(tmp_path)
    (tmp_path / "no-processor").mkdir()
    (tmp_path / "no-processor" / "config.json").write_text((llava / "config.json").read_text())
    with pytest.raises(UserError, match="has no processor_config.json"):
        load_vlm(tmp_path / "no-processor")
    text_only = save_chat_checkpoint(tmp_path / "qwen", "qwen2")
    with pytest.raises(UserError, match="holds a 'qwen2' checkpoint, not an image-text-to-text one"):
        build_model(load(micro_params(tmp_path), [f"viskg.model.path={text_only}"]).viskg, 0)
