"""`model.sampler_dtype: bfloat16` on a float32 checkpoint: rollout tokens/s against the float32 sampler (alternated,
medians of 3 after one warm-up each) and the sampler-trainer gap it adds (k3 of the sampled tokens' bf16 log-probs
against the float32 training forward's, and the largest |log ratio|), on 8 held-out word problems x G=4 x 48 tokens
(EOS off: every row runs the budget).

    .venv/bin/python benchmarks/sampler_dtype.py MODEL_DIR PROBLEMS.jsonl [THREADS]

MODEL_DIR: a `from_pretrained` directory (the `import` stage's `model/`: examples/smollm2); PROBLEMS.jsonl: rows with
a `question` (examples/word_problems/generate.py's held-out file). Prints one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch


def main(model_dir: str, problems: str, threads: int = 1) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.decoders import use_sampler_dtype
    from posttrain.models.logprobs import completion_logprobs
    from posttrain.rollout.sampling import encode_prompts, sample

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(problems) as f:
        rows = [json.loads(line) for line in f][:8]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True) for r in rows]
    ids, mask = encode_prompts(tok, prompts, torch.device("cpu"))

    def run(dtype: torch.dtype | None, seed: int):
        use_sampler_dtype(model, dtype)
        start = time.perf_counter()
        out = sample(model, ids, mask, group_size=4, max_new_tokens=48, eos_id=-1, pad_id=tok.pad_token_id,
                     generator=torch.Generator().manual_seed(seed))
        return out, int(out.completion_mask.sum()) / (time.perf_counter() - start)

    run(None, 0), run(torch.bfloat16, 0)  # warm-up, each side
    speed, gaps = {"float32": [], "bfloat16": []}, []
    for repeat in range(3):
        speed["float32"].append(run(None, repeat)[1])
        out, tok_s = run(torch.bfloat16, repeat)
        speed["bfloat16"].append(tok_s)
        with torch.no_grad():  # the trainer's float32 log-probs of the tokens the bf16 sampler drew
            trainer, _ = completion_logprobs(model, ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0), out.completion_ids, out.completion_mask)
        log_ratio = (trainer - out.logp)[out.completion_mask.bool()].double()
        gaps.append({"k3": float((log_ratio.exp() - 1 - log_ratio).mean()), "max_abs_log_ratio": float(log_ratio.abs().max())})
    use_sampler_dtype(model, None)
    return {"tok_s": {k: [round(x, 1) for x in v] for k, v in speed.items()}, "threads": threads,
            "ratio_bf16_over_fp32": statistics.median(speed["bfloat16"]) / statistics.median(speed["float32"]), "mismatch": gaps}


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: sampler_dtype.py MODEL_DIR PROBLEMS.jsonl [THREADS]")
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 1)), flush=True)
