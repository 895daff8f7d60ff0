"""A tiny chat checkpoint for the word problems, shaped like a real one: a byte-level BPE tokenizer learnt from the
training problems (Qwen2's special tokens and chat template) and a freshly initialised Qwen2 (or Llama), written
by `save_pretrained` so that `model.path` loads it exactly as it would load Qwen2.5.

    python examples/word_problems/make_model.py --data examples/word_problems/data --out examples/word_problems/model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from posttrain import resolve
from posttrain.models import build_tiny, save_pretrained, train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PROMPT = "Solve the problem. End with: so the answer is N."


def make_model(data: Path, out: Path, arch: str = "qwen2", vocab_size: int = 600, hidden: int = 64, layers: int = 2,
               positions: int = 256, seed: int = 0) -> Path:
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    corpus = [text for row in rows for text in (row["question"], row["solution"])] + [SYSTEM_PROMPT, "system user assistant"]
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size)
    sizes = [f"model.arch={arch}", f"model.hidden_size={hidden}", f"model.intermediate_size={4 * hidden}", f"model.layers={layers}",
             "model.heads=4", "model.kv_heads=2", f"model.max_positions={positions}"]
    torch.manual_seed(seed)
    model = build_tiny(resolve.load(REPO / "params.yaml", sizes).model, tokenizer)
    save_pretrained(model, tokenizer, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "model")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    args = parser.parse_args()
    print(f"wrote {make_model(args.data, args.out, args.arch)}")


if __name__ == "__main__":
    main()
