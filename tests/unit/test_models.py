"""Tiny models from a config, the from_pretrained round trip (offline), and LoRA merge-on-save."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from posttrain.resolve import load
from posttrain.errors import UserError
from posttrain.models import build_tiny, load_pretrained, maybe_lora, save_pretrained


@pytest.fixture(scope="module")
def model_cfg(params_path):
    return load(params_path, ["model.hidden_size=32", "model.intermediate_size=48", "model.heads=4", "model.kv_heads=2"]).model


def tiny(model_cfg, char_tokenizer, seed=0):
    torch.manual_seed(seed)
    return build_tiny(model_cfg, char_tokenizer).eval()


def sample_ids(tokenizer) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(p, add_special_tokens=False) for p in ["37+48=85", "05-99=-9"]])


@torch.no_grad()
def logits(model, ids) -> torch.Tensor:
    return model(input_ids=ids).logits


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_build_tiny_sizes(model_cfg, char_tokenizer, arch):
    cfg = model_cfg.model_copy(update={"arch": arch})
    model = build_tiny(cfg, char_tokenizer)
    c = model.config
    assert c.model_type == arch
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (32, cfg.layers, 4, 2)
    assert c.intermediate_size == 48 and c.max_position_embeddings == cfg.max_positions
    assert c.vocab_size == len(char_tokenizer)
    assert c.pad_token_id == char_tokenizer.pad_token_id and c.eos_token_id == char_tokenizer.eos_token_id
    assert model.get_input_embeddings().weight.shape == (len(char_tokenizer), 32)
    assert len(model.model.layers) == cfg.layers
    assert next(model.parameters()).dtype == torch.float32
    assert logits(model.eval(), sample_ids(char_tokenizer)).shape == (2, 8, len(char_tokenizer))


def test_save_load_round_trip(model_cfg, char_tokenizer, tmp_path):
    model = tiny(model_cfg, char_tokenizer)
    ids = sample_ids(char_tokenizer)
    save_pretrained(model, char_tokenizer, tmp_path / "model")
    assert (tmp_path / "model" / "config.json").is_file()
    loaded, tokenizer = load_pretrained(tmp_path / "model")
    loaded.eval()
    assert isinstance(loaded, PreTrainedModel) and type(loaded) is type(model)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), rtol=0, atol=0)
    assert tokenizer.get_vocab() == char_tokenizer.get_vocab()
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id == char_tokenizer.pad_token_id
    # a string path works too
    again, _ = load_pretrained(str(tmp_path / "model"))
    torch.testing.assert_close(logits(again.eval(), ids), logits(model, ids), rtol=0, atol=0)


def test_load_missing_path(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_pretrained(tmp_path / "nope")


def test_load_dir_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match="config.json"):
        load_pretrained(tmp_path)


def test_load_unknown_hub_id_offline():
    with pytest.raises(UserError, match="nonexistent-org-xyz/nonexistent-model"):
        load_pretrained("nonexistent-org-xyz/nonexistent-model")


def test_lora_r0_is_identity(model_cfg, char_tokenizer):
    model = tiny(model_cfg, char_tokenizer)
    assert maybe_lora(model, model_cfg.lora.model_copy(update={"r": 0})) is model


def test_lora_trains_only_adapters_and_merges_on_save(model_cfg, char_tokenizer, tmp_path):
    lora_cfg = model_cfg.lora.model_copy(update={"r": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj")})
    base = tiny(model_cfg, char_tokenizer)
    ids = sample_ids(char_tokenizer)
    base_logits = logits(base, ids)
    model = maybe_lora(base, lora_cfg)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * model_cfg.layers  # A and B, for q and v, in every layer
    assert frozen and not any("lora_" in n for n in frozen)
    # LoRA B starts at zero; move it so the merge has something to merge
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.eval()
    adapted = logits(model, ids)
    assert not torch.allclose(adapted, base_logits, atol=1e-3)
    save_pretrained(model, char_tokenizer, tmp_path / "merged")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    loaded, _ = load_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    torch.testing.assert_close(logits(loaded.eval(), ids), adapted, rtol=1e-4, atol=1e-4)


def test_reloaded_tokenizer_keeps_spaces_next_to_a_model_config(model_cfg, tmp_path):
    """Saved beside a qwen2 config.json, a char tokenizer must not come back as Qwen2Tokenizer, whose own
    pre-tokenizer drops the spaces of our vocabulary (transformers 5's AutoTokenizer prefers the model type)."""
    from posttrain.models import train_char_tokenizer

    spaced = train_char_tokenizer(["abcdefghijklmnopqrstuvwxyz :,"])
    save_pretrained(tiny(model_cfg, spaced), spaced, tmp_path / "model")
    _, tokenizer = load_pretrained(tmp_path / "model")
    for text in ["dalun lives in:", "a, b , c"]:
        assert tokenizer(text).input_ids == spaced(text).input_ids, type(tokenizer).__name__
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == spaced.pad_token_id
