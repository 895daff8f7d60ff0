"""GRPO step and rollout speed: posttrain against TRL's `GRPOTrainer` and plain `model.generate`, in one run.

    python benchmarks/grpo_step.py --json bench.json [--params params.yaml] [--set rl.group_size=4 ...]

Both sides get the same tiny model (built from `params.yaml`'s `model` section and warmed up by a short
SFT so completions end with EOS as they do in the pipeline), the same character tokenizer, the same
arithmetic prompts, group size, completion budget and loss settings (`rl` section), the same number of
torch threads, and separate copies of the same starting weights.

* Step: one full update = rollout + rewards + advantages + forward/backward + optimizer step. Ours is
  `posttrain.trainers.online_rl.OnlineRL.step`, the body of the training loop. TRL's is one
  `GRPOTrainer` optimizer step (generation batch = train batch, so every step generates). The two are
  interleaved inside one `trainer.train()` call (ours runs in a callback after each TRL step, and is
  excluded from TRL's interval), so machine load hits both alike; the first `--warmup` steps are dropped.
* Rollout: our `sample()` against `model.generate(do_sample=True, num_return_sequences=G)` with its KV
  cache, on the same prompt batch, with EOS disabled on both sides so every row produces exactly
  `max_new_tokens` tokens; alternated repeats, medians.

Prints a table and writes `{"ours_step_s", "trl_step_s", "step_ratio", "rollout_ratio", ...}` to --json.
Targets: step_ratio <= 0.5 (ours at most half of TRL's time), rollout_ratio >= 1.5.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STEP_TARGET, ROLLOUT_TARGET = 0.5, 1.5
LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo"}  # our aggregation -> TRL's loss_type with the same normaliser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="params override, repeatable")
    parser.add_argument("--steps", type=int, default=16, help="measured GRPO steps per side (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="GRPO steps per side dropped before measuring")
    parser.add_argument("--rollout-repeats", type=int, default=20, help="timed rollouts per side")
    parser.add_argument("--sft-steps", type=int, default=200, help="SFT warm-up steps on the shared starting model (0: random init)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides (1 is steadiest on a shared 2-core box)")
    return parser.parse_args(argv)


def quiet() -> None:
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- shared setup --------------------------------------------------------------------------------------


def build(cfg, sft_steps: int):
    """The task, its training prompts, the tokenizer, and the starting model (optionally SFT-warmed)."""
    import torch

    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.models.sampling import encode_prompts
    from posttrain.runtime import seed_everything
    from posttrain.trainers.sft import train_sft

    seed_everything(cfg.pipeline.seed)
    task = build_task(cfg.task)
    train = task.splits(cfg.pipeline.seed)["train"]
    tokenizer = train_char_tokenizer([task.alphabet()])
    model = build_tiny(cfg.model, tokenizer)
    if sft_steps:
        sft_cfg = cfg.sft.model_copy(update={"steps": sft_steps, "warmup_steps": min(cfg.sft.warmup_steps, sft_steps)})
        pool = train[: cfg.sft.n_examples] if cfg.sft.n_examples else train
        train_sft(model, tokenizer, pool, sft_cfg, cfg.pipeline.seed, on_log=lambda step, metrics: None)
    model.zero_grad(set_to_none=True)
    return task, train, tokenizer, model.to(torch.device("cpu"))


def check_comparable(rl) -> None:
    problems = []
    if rl.advantage != "grpo" or rl.loss != "clip":
        problems.append(f"rl.advantage/rl.loss must be grpo/clip for a TRL GRPO peer (got {rl.advantage}/{rl.loss})")
    if rl.loss_agg not in LOSS_TYPE:
        problems.append(f"rl.loss_agg {rl.loss_agg!r} has no TRL loss_type counterpart")
    if rl.epochs_per_batch != 1:
        problems.append("rl.epochs_per_batch must be 1 (one optimizer step per generation on both sides)")
    unknown = {r.name for r in rl.rewards} - {"correctness", "format"}
    if unknown:
        problems.append(f"rewards {sorted(unknown)} have no TRL wrapper here")
    if problems:
        sys.exit("grpo_step: " + "; ".join(problems))


# -- ours ----------------------------------------------------------------------------------------------


class OurLoop:
    """The state `train_online_rl` sets up, and one call of its step body per `step()`."""

    def __init__(self, cfg, task, train, tokenizer, model):
        from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

        rl = cfg.rl
        self.run = RLRun(
            policy=model, tokenizer=tokenizer, task=task, examples=train, cfg=rl, seed=cfg.pipeline.seed,
            checkpoint_dir=Path(tempfile.mkdtemp(prefix="grpo_bench_ours_")), config_hash="benchmark",
        )
        self.trainer = OnlineRL(self.run)  # optimizer, schedule, generator, reference (when beta > 0)
        self.stream = PromptStream(train, cfg.pipeline.seed)
        self.completion_lengths: list[float] = []
        model.train()

    def step(self) -> float:
        start = time.perf_counter()
        metrics = self.trainer.step(self.stream.take(self.run.cfg.prompts_per_step)).metrics
        seconds = time.perf_counter() - start
        self.completion_lengths.append(metrics["completion_length"])
        return seconds


# -- TRL -----------------------------------------------------------------------------------------------


def trl_rewards(task, tokenizer, specs):
    """Our registered rewards, in TRL's reward-function signature; `finished` = the completion kept its EOS."""
    from posttrain.tasks import Example

    eos = tokenizer.eos_token_id

    def correctness(prompts, completions, completion_ids, answer, **_):
        rows = zip(prompts, completions, completion_ids, answer)
        return [task.correctness_reward(c, bool(ids) and ids[-1] == eos, Example(p, a, a)) for p, c, ids, a in rows]

    def format(prompts, completions, completion_ids, **_):  # noqa: A001 (TRL logs the function name)
        return [task.format_reward(c, bool(ids) and ids[-1] == eos) for c, ids in zip(completions, completion_ids)]

    table = {"correctness": correctness, "format": format}
    return [table[s.name] for s in specs], [s.weight for s in specs]


def trl_config(rl, seed: int, total_steps: int, out_dir: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out_dir,
        # the same objective and optimisation as ours
        per_device_train_batch_size=rl.prompts_per_step * rl.group_size,  # one optimizer step per generation batch
        gradient_accumulation_steps=1,
        num_generations=rl.group_size,
        max_completion_length=rl.max_new_tokens,
        temperature=rl.temperature,
        top_p=1.0,
        top_k=0,
        beta=rl.beta,
        epsilon=rl.clip_eps_low,
        epsilon_high=rl.clip_eps_high,
        loss_type=LOSS_TYPE[rl.loss_agg],
        scale_rewards=rl.std_scaling,
        num_iterations=1,
        mask_truncated_completions=False,
        learning_rate=rl.lr,
        lr_scheduler_type="cosine",
        warmup_steps=rl.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=rl.max_grad_norm,
        max_steps=total_steps,
        seed=seed,
        # plain CPU training, nothing written or reported
        use_cpu=True,
        bf16=False,
        fp16=False,
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        logging_steps=total_steps + 1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )


def make_interleaver(ours: OurLoop, threads: int, max_new_tokens: int):
    import torch
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """Times each TRL optimizer step, then runs one of our steps outside TRL's interval."""

        def __init__(self):
            self.trl: list[float] = []
            self.ours: list[float] = []
            self.trl_lengths: list[float] = []
            self.trainer = None
            self.resume = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            self.resume = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.trl.append(time.perf_counter() - self.resume)
            logged = getattr(self.trainer, "_metrics", {}).get("train", {})
            lengths, longest = logged.get("completions/mean_length", []), logged.get("completions/max_length", [])
            self.trl_lengths.append(float(lengths[-1]) if lengths else float("nan"))
            if longest and longest[-1] > max_new_tokens:
                raise RuntimeError(f"TRL generated {longest[-1]} tokens, over the budget of {max_new_tokens}")
            if torch.get_num_threads() != threads:
                raise RuntimeError(f"torch threads changed to {torch.get_num_threads()} during TRL's step")
            self.ours.append(ours.step())
            self.resume = time.perf_counter()

    return Interleave()


def run_steps(cfg, task, train, tokenizer, model, total_steps: int, threads: int):
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    rl = cfg.rl
    ours = OurLoop(cfg, task, train, tokenizer, copy.deepcopy(model))
    callback = make_interleaver(ours, threads, rl.max_new_tokens)
    funcs, weights = trl_rewards(task, tokenizer, rl.rewards)
    args = trl_config(rl, cfg.pipeline.seed, total_steps, tempfile.mkdtemp(prefix="grpo_bench_trl_"))
    args.reward_weights = weights
    dataset = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in train])
    trainer = GRPOTrainer(
        model=copy.deepcopy(model), reward_funcs=funcs, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[callback]
    )
    trainer.remove_callback(PrinterCallback)  # its end-of-run dict would bury our table
    callback.trainer = trainer
    # TRL tokenises prompts itself: it must see exactly the ids we sample from
    ours_ids = tokenizer([e.prompt for e in train[:4]], add_special_tokens=False)["input_ids"]
    trl_ids = trainer.processing_class(text=[e.prompt for e in train[:4]])["input_ids"]
    assert ours_ids == trl_ids, "TRL would tokenise the prompts differently"
    trainer.train()
    callback.optimizer = type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer).__name__
    callback.optim = str(args.optim)
    return callback, ours


# -- rollout -------------------------------------------------------------------------------------------


def run_rollouts(cfg, train, tokenizer, model, repeats: int, device: str = "cpu", warmup: int = 2) -> dict[str, float]:
    """Median seconds of our `sample()` and of `model.generate` on the same prompts, alternated, on `device`."""
    import torch

    from posttrain.models.sampling import encode_prompts, sample

    rl = cfg.rl
    device = torch.device(device)
    model = copy.deepcopy(model).to(device).eval()
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in train[: rl.prompts_per_step]], device)
    generator = torch.Generator(device=device).manual_seed(cfg.pipeline.seed)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(cfg.pipeline.seed)
    rows, width = ids.shape[0] * rl.group_size, rl.max_new_tokens

    def ours() -> int:  # eos_id -1 never matches: every row runs the full budget
        out = sample(model, ids, mask, group_size=rl.group_size, max_new_tokens=width, eos_id=-1, pad_id=tokenizer.pad_token_id,
                     temperature=rl.temperature, generator=generator)
        return int(out.completion_mask.sum())

    def hf() -> int:  # eos_token_id=None: no stopping criterion on EOS
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, num_return_sequences=rl.group_size, max_new_tokens=width,
                temperature=rl.temperature, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
            )
        return int(out[:, ids.shape[1]:].numel())

    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for _ in range(warmup):
        ours(), hf()
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("hf", hf)):
            sync()
            start = time.perf_counter()
            produced = fn()  # its int() reads the result back, which waits for the device
            times[name].append(time.perf_counter() - start)
            assert produced == rows * width, f"{name} produced {produced} tokens, expected {rows * width}"
    ours_s, hf_s = median(times["ours"]), median(times["hf"])
    return {
        "ours_rollout_s": ours_s, "hf_rollout_s": hf_s,
        "ours_rollout_tok_s": rows * width / ours_s, "hf_rollout_tok_s": rows * width / hf_s,
        "rollout_ratio": hf_s / ours_s, "rollout_tokens": rows * width,
    }


# -- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    import torch
    import transformers
    import trl

    from posttrain import resolve

    torch.set_num_threads(args.threads)
    total_steps = args.warmup + args.steps
    # rl.steps sizes our LR schedule; TRL's max_steps is the same number, so both schedules match
    cfg = resolve.load(args.params, [*args.overrides, f"rl.steps={total_steps}"])
    check_comparable(cfg.rl)
    rl = cfg.rl
    started = time.perf_counter()
    task, train, tokenizer, model = build(cfg, args.sft_steps)

    rollout = run_rollouts(cfg, train, tokenizer, model, args.rollout_repeats)
    callback, ours = run_steps(cfg, task, train, tokenizer, model, total_steps, args.threads)
    skip = args.warmup
    ours_step, trl_step = median(callback.ours[skip:]), median(callback.trl[skip:])
    result = {
        "ours_step_s": ours_step,
        "trl_step_s": trl_step,
        "step_ratio": ours_step / trl_step,
        **rollout,
        "ours_completion_length": median(ours.completion_lengths[skip:]),
        "trl_completion_length": median(callback.trl_lengths[skip:]),
        "ours_step_times_s": callback.ours,
        "trl_step_times_s": callback.trl,
        "targets": {"step_ratio_max": STEP_TARGET, "rollout_ratio_min": ROLLOUT_TARGET},
        "settings": {
            "threads": args.threads, "steps": args.steps, "warmup": args.warmup, "rollout_repeats": args.rollout_repeats,
            "sft_steps": args.sft_steps, "prompts_per_step": rl.prompts_per_step, "group_size": rl.group_size,
            "max_new_tokens": rl.max_new_tokens, "temperature": rl.temperature, "lr": rl.lr, "beta": rl.beta,
            "clip_eps": [rl.clip_eps_low, rl.clip_eps_high], "loss_agg": rl.loss_agg, "trl_loss_type": LOSS_TYPE[rl.loss_agg],
            "std_scaling": rl.std_scaling, "model": cfg.model.model_dump(mode="json"),
            "optimizers": {"ours": "torch.optim.AdamW (defaults)", "trl": f"{callback.optim} ({callback.optimizer})"},
            "parameters": sum(p.numel() for p in model.parameters()),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        },
        "wall_s": time.perf_counter() - started,
    }
    result["step_target_met"] = result["step_ratio"] <= STEP_TARGET
    result["rollout_target_met"] = result["rollout_ratio"] >= ROLLOUT_TARGET

    n, width = rl.prompts_per_step * rl.group_size, rl.max_new_tokens
    print(f"\nGRPO step: {rl.prompts_per_step} prompts x G={rl.group_size}, <= {width} new tokens, "
          f"{result['settings']['parameters']:,} params, {args.threads} thread(s); "
          f"medians of {args.steps} interleaved steps after {args.warmup} warm-up")
    print(f"{'':28}{'posttrain':>14}{'peer':>14}{'ratio':>9}  target")
    print(f"{'step seconds (vs TRL)':28}{ours_step:>14.4f}{trl_step:>14.4f}{result['step_ratio']:>9.3f}  <= {STEP_TARGET}"
          f"  {'met' if result['step_target_met'] else 'MISSED'}")
    print(f"{'rollout tok/s (vs generate)':28}{rollout['ours_rollout_tok_s']:>14,.0f}{rollout['hf_rollout_tok_s']:>14,.0f}"
          f"{rollout['rollout_ratio']:>9.3f}  >= {ROLLOUT_TARGET}  {'met' if result['rollout_target_met'] else 'MISSED'}")
    print(f"{'rollout seconds':28}{rollout['ours_rollout_s']:>14.4f}{rollout['hf_rollout_s']:>14.4f}"
          f"   ({n} rows x {width} tokens, EOS off)")
    print(f"{'completion length in steps':28}{result['ours_completion_length']:>14.2f}{result['trl_completion_length']:>14.2f}"
          "   (EOS on: either side may stop early)")
    print(f"wall {result['wall_s']:.1f}s -> {args.json}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
