"""Stage `import` on GGUF files the test writes itself (the `gguf` package's writer): a tiny Llama and a tiny Qwen2 with a byte-level
BPE tokenizer and a chat template each become a `save_pretrained` directory equal to what transformers reads from the file;
sources a user can get wrong end with one line."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from helpers import micro_params, posttrain_main

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
SIZES = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "context": 128}


def write_tiny_gguf(path: Path, seed: int = 0, architecture: str = "llama") -> Path:
    """A float32 GGUF of a tiny Llama (or Qwen2: the same tensors plus the attention projections' biases) with the
    metadata transformers' reader needs (architecture sizes, a `gpt2` BPE tokenizer)."""
    from posttrain.models import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["Ana has 3 apples and finds 4 more.", "so the answer is 7", "system user assistant"], vocab_size=300)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted({**model["vocab"], **{t.content: i for i, t in tokenizer.added_tokens_decoder.items()}}.items(), key=lambda kv: kv[1])
    tokens = [token for token, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    special = {t.content for t in tokenizer.added_tokens_decoder.values()}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    h, n_layers, heads, kv, ffn = SIZES["hidden"], SIZES["layers"], SIZES["heads"], SIZES["kv_heads"], SIZES["ffn"]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(SIZES["context"])
    writer.add_embedding_length(h)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(h // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_bos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(seed)
    weight = lambda *shape: (rng.standard_normal(shape) * 0.2).astype(np.float32)  # noqa: E731  (torch layout: [out, in])
    writer.add_tensor("token_embd.weight", weight(len(tokens), h))
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(n_layers):
        for name, shape in (("attn_q", (h, h)), ("attn_k", (kv * h // heads, h)), ("attn_v", (kv * h // heads, h)), ("attn_output", (h, h)),
                            ("ffn_gate", (ffn, h)), ("ffn_up", (ffn, h)), ("ffn_down", (h, ffn))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
            if architecture == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(f"blk.{i}.{name}.bias", weight(shape[0]))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture, expected", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_a_gguf_imports_as_the_model_transformers_reads(architecture, expected, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models import load_pretrained

    tiny_gguf = write_tiny_gguf(tmp_path / f"tiny-{architecture}.F32.gguf", architecture=architecture)
    params = micro_params(tmp_path, checkpoint={"source": str(tiny_gguf)})
    code, out, err = posttrain_main(monkeypatch, capsys, "import", "--params", str(params), "--out", str(tmp_path / "import"))
    assert code == 0, err
    metrics = json.loads(out.splitlines()[-1])
    source = json.loads((tmp_path / "import" / "source.json").read_text())
    assert source["format"] == "gguf" and source["architecture"] == expected and len(source["sha256"]) == 64
    model, tokenizer = load_pretrained(tmp_path / "import" / "model")
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters()) and metrics["has_chat_template"] == 1.0
    if architecture == "qwen2":  # the biases came through (both sides reading none would also agree below)
        assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    assert "quantization_config" not in json.loads((tmp_path / "import" / "model" / "config.json").read_text())
    reference = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    ref_tokenizer = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    text = "Ana has 3 apples and finds 4 more."
    assert tokenizer(text)["input_ids"] == ref_tokenizer(text)["input_ids"]
    conversation = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": text}]
    assert tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) == \
        ref_tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("source, says", [
    ("missing.gguf", "checkpoint source not found: missing.gguf"),
    ("package:no_such_package_here/model.gguf", "package 'no_such_package_here' is not installed"),
    ("package:gguf/absent.gguf", "no file 'absent.gguf' in package 'gguf'"),
    ("garbage.gguf", "cannot read"),
])
def test_a_bad_source_is_one_line(tmp_path, monkeypatch, capsys, source, says):
    (tmp_path / "garbage.gguf").write_bytes(b"not a gguf file at all")
    monkeypatch.chdir(tmp_path)
    params = micro_params(tmp_path, checkpoint={"source": source})
    code, out, err = posttrain_main(monkeypatch, capsys, "import", "--params", str(params), "--out", str(tmp_path / "import"))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "import").exists()


def test_a_plain_checkpoint_directory_is_a_model_input(chat_checkpoints, tmp_path):
    """`--in model=DIR` / `--in policy=DIR` take a save_pretrained directory as well as a stage output holding `model/`."""
    from posttrain.stages import check_inputs, model_dir

    plain = chat_checkpoints["llama"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "heldout.jsonl").write_text("")
    resolved = check_inputs("eval", {"data": tmp_path / "data", "model": plain})
    assert model_dir(resolved["model"]) == plain
    output = tmp_path / "stage"
    (output / "model").mkdir(parents=True)
    (output / "model" / "config.json").write_text("{}")
    assert model_dir(output) == output / "model"
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="or a checkpoint directory with config.json"):
        check_inputs("eval", {"data": tmp_path / "data", "model": tmp_path / "data"})
