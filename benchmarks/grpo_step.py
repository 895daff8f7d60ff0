"""GRPO step and rollout speed: posttrain against TRL's `GRPOTrainer` and plain `model.generate`, in one run.

    python benchmarks/grpo_step.py --json bench.json [--shape tiny|small] [--params params.yaml] [--set rl.group_size=4 ...]
    python benchmarks/grpo_step.py --json bench.json --shape small --scaling   # + step time vs length and group size

Shapes (`--shape`, applied before `--set`): `tiny` is `params.yaml`'s model and `rl` section as they are (124k
parameters, SFT-warmed, EOS on: completions stop after a few tokens); `small` is a shape where compute matters
(4.3M parameters, 16 prompts x G=8 x 96 new tokens, random init, EOS off on both sides so every completion is
exactly `max_new_tokens` long in the steps too). `--dry-run` builds the shape's config and model, writes its
summary and stops (no SFT, no TRL).

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

* Roofline: the best time of an `n x n @ n x n` matmul (n = 2048) in the model's dtype on the same threads, measured
  in the same process before and after the rollouts; `roofline_fraction` = the rollout's achieved FLOP/s over it. A
  rollout's FLOPs are counted per produced token: 2 x the matmul parameters (every `nn.Linear`, the tied LM head
  included, embeddings excluded) + 4 x layers x hidden x attended positions (QK^T and AV). The prompt prefill is
  not counted, so the fraction is a lower bound.
* Memory: the peak resident set size above the one at the start of each call (a poller reading
  /proc/self/statm every 2 ms), max over calls, per side: during the interleaved steps, and in one extra untimed
  rollout per side after them. Before each call `malloc_trim(0)` hands glibc's free pages back (outside the timed
  interval), so memory freed by the other side does not hide this side's allocations; both sides share one
  process, so read these as indicative.
* Scaling (`--scaling`): step time of both sides vs completion length (32 -> 256) and group size (4 -> 32) at
  `--scaling-prompts` prompts per step, EOS off, a few steps per point; a table in the JSON and a figure.

Prints a table and writes `{"ours_step_s", "trl_step_s", "step_ratio", "step_ratio_paired" (the median of the
per-step ratios, each of our steps over the TRL step right before it), "rollout_ratio", "roofline_fraction",
"ours_step_peak_mib", "trl_step_peak_mib", "ours_rollout_peak_mib", "hf_rollout_peak_mib", ...}` to --json,
with the load average at the start and the end (the machine is shared: ratios measured in one run are what count).
Targets: step_ratio <= 0.5 (ours at most half of TRL's time), rollout_ratio >= 1.5, roofline_fraction >= 0.65.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STEP_TARGET, ROLLOUT_TARGET, ROOFLINE_TARGET = 0.5, 1.5, 0.65
# on one H200 at the anchor shape: our step at most 0.2x TRL's, rollout >= 30,000 tokens/s, update MFU >= 40%
GPU_STEP_TARGET, GPU_ROLLOUT_TOK_S_TARGET, GPU_MFU_TARGET = 0.2, 30_000, 0.40
EOS_LOGIT = -1e9  # what the EOS logit becomes with EOS off: probability exactly 0 in float32, finite log-prob

# named shapes: params overrides (applied before --set), EOS on/off, and the defaults of the run's own flags
SHAPES: dict[str, dict] = {
    "tiny": {"overrides": [], "eos": True, "sft_steps": 200, "steps": 16, "rollout_repeats": 20},
    "small": {
        "overrides": [
            "model.hidden_size=256", "model.layers=4", "model.intermediate_size=1152", "model.max_positions=160",
            "rl.max_new_tokens=96", "rl.prompts_per_step=16", "rl.group_size=8",
        ],
        "eos": False, "sft_steps": 0, "steps": 6, "rollout_repeats": 6,
    },
    # the GPU anchor: Qwen2-0.5B's transformer (358M matmul weights; the character vocabulary keeps the head small)
    "anchor": {
        "overrides": [
            "model.arch=qwen2", "model.hidden_size=896", "model.layers=24", "model.heads=14", "model.kv_heads=2",
            "model.intermediate_size=4864", "model.max_positions=512", "model.dtype=bfloat16",
            "rl.max_new_tokens=128", "rl.prompts_per_step=64", "rl.group_size=8",
        ],
        "eos": False, "sft_steps": 0, "steps": 3, "warmup": 1, "rollout_repeats": 3,
    },
    # SmolLM2-135M-Instruct's shape (LlamaForCausalLM, tied 49,152-token head), randomly initialised: the character
    # tokenizer is padded with filler characters to the real vocabulary, so the head costs what it costs there
    "smollm2": {
        "overrides": [
            "model.arch=llama", "model.hidden_size=576", "model.layers=30", "model.heads=9", "model.kv_heads=3",
            "model.intermediate_size=1536", "model.max_positions=512",
            "rl.max_new_tokens=64", "rl.prompts_per_step=16", "rl.group_size=4",
            "rl.micro_batch=4",  # one group a pass, both sides (TRL: 4 rows a device batch, 16 accumulation steps), as examples/smollm2 runs
        ],
        "eos": False, "sft_steps": 0, "steps": 3, "warmup": 1, "rollout_repeats": 3, "vocab": 49_152,
    },
}
SCALING_LENGTHS, SCALING_GROUPS = (32, 64, 128, 256), (4, 8, 16, 32)
LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo"}  # our aggregation -> TRL's loss_type with the same normaliser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="params override, repeatable")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="named model/rollout shape (see the docstring)")
    parser.add_argument("--steps", type=int, default=None, help="measured GRPO steps per side after warm-up (default: the shape's)")
    parser.add_argument("--warmup", type=int, default=None, help="GRPO steps per side dropped before measuring (default: the shape's, else 2)")
    parser.add_argument("--rollout-repeats", type=int, default=None, help="timed rollouts per side (default: the shape's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT warm-up steps on the shared starting model (0: random init; default: the shape's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides (1 is steadiest on a shared 2-core box)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda: where both sides train and sample")
    parser.add_argument("--roofline-n", type=int, default=2048, help="side of the matmul (in the model's dtype) that sets the roofline")
    parser.add_argument("--dry-run", action="store_true", help="build the shape's config and model, write its summary, stop")
    parser.add_argument("--scaling", action="store_true", help="also time both steps vs completion length and group size")
    parser.add_argument("--scaling-prompts", type=int, default=4, help="prompts per step in the scaling table")
    parser.add_argument("--scaling-steps", type=int, default=2, help="measured steps per side and point (after one warm-up)")
    parser.add_argument("--scaling-lengths", type=int, nargs="+", default=list(SCALING_LENGTHS))
    parser.add_argument("--scaling-groups", type=int, nargs="+", default=list(SCALING_GROUPS))
    parser.add_argument("--figure", type=Path, default=None, help="scaling figure (default: next to --json, .png)")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    for key in ("steps", "rollout_repeats", "sft_steps"):
        if getattr(args, key) is None:
            setattr(args, key, shape[key])
    if args.warmup is None:
        args.warmup = shape.get("warmup", 2)
    args.vocab = shape.get("vocab")
    args.eos = shape["eos"]
    return args


def quiet() -> None:
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class RssWatch:
    """Peak resident memory per labelled call: a daemon thread reads /proc/self/statm every `interval` seconds;
    each `with watch.call(label):` records its peak RSS and the RSS at its start; `peak_mib(label)` is the largest
    rise over calls with that label."""

    PAGE = os.sysconf("SC_PAGE_SIZE")
    try:
        import ctypes
        import ctypes.util

        _trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):  # not glibc: no trim, rises may be undercounted
        _trim = None

    def __init__(self, interval: float = 0.002):
        self.interval, self.label, self.start, self.high = interval, None, 0, 0
        self.rises: dict[str, list[int]] = {}
        self.peaks: dict[str, int] = {}
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self.PAGE

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            now = self.rss()
            with self._lock:
                self.high = max(self.high, now)

    def begin(self, label: str) -> None:
        if self._trim is not None:
            self._trim(0)
        with self._lock:
            self.label, self.start = label, self.rss()
            self.high = self.start

    def end(self) -> None:
        end = self.rss()
        with self._lock:
            label, high = self.label, max(self.high, end)
            if label is not None:
                self.rises.setdefault(label, []).append(high - self.start)
                self.peaks[label] = max(self.peaks.get(label, 0), high)
            self.label = None

    @contextlib.contextmanager
    def call(self, label: str):
        self.begin(label)
        try:
            yield
        finally:
            self.end()

    def peak_mib(self, label: str) -> float:
        return max(self.rises.get(label, [0])) / 2**20

    def peak_rss_mib(self, label: str) -> float:
        return self.peaks.get(label, 0) / 2**20

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)


def matmul_roofline(n: int, repeats: int = 5, device: str = "cpu", dtype: str = "float32") -> float:
    """FLOP/s of the best of `repeats` `n x n @ n x n` matmuls in `dtype` on `device` (the current torch threads)."""
    import torch

    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    a @ b  # warm-up (thread pool, page faults, cuBLAS handle)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def linear_parameters(model) -> int:
    """Weights that a forward multiplies by (every `nn.Linear`, the tied LM head once per token); no embeddings."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def rollout_flops(model, prompt_width: int, max_new_tokens: int, rows: int) -> float:
    """Decode FLOPs of `rows` completions of `max_new_tokens` tokens after `prompt_width` prompt positions:
    2 x matmul weights per token + QK^T and AV over the attended positions (4 x layers x hidden x positions)."""
    cfg = model.config
    width = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    attended = sum(prompt_width + t + 1 for t in range(max_new_tokens))
    return rows * (2 * linear_parameters(model) * max_new_tokens + 4 * cfg.num_hidden_layers * width * attended)


def eos_off(model, eos_id: int) -> None:
    """EOS never sampled, on any side: the LM head's EOS logit becomes EOS_LOGIT (a forward hook, so our decoder,
    our training forward, `generate` and TRL all see the same distribution without EOS)."""
    import torch

    index: dict[torch.device, torch.Tensor] = {}  # per device, made on the first call (no host copy in a CUDA graph)

    def hook(module, inputs, output):
        if output.device not in index:
            index[output.device] = torch.tensor([eos_id], device=output.device)
        return output.index_fill(-1, index[output.device], EOS_LOGIT)

    model.get_output_embeddings().register_forward_hook(hook)


# -- shared setup --------------------------------------------------------------------------------------


def filler_characters(count: int, taken: str) -> str:
    """`count` distinct characters outside `taken`, from Unicode's private-use planes (never in a prompt)."""
    pool = (chr(c) for r in (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE)) for c in r)
    taken_set = set(taken)
    chars = [c for c, _ in zip((c for c in pool if c not in taken_set), range(count))]
    if len(chars) < count:
        raise ValueError(f"cannot pad the vocabulary by {count} characters")
    return "".join(chars)


def build(cfg, sft_steps: int, eos: bool = True, vocab: int | None = None):
    """The task, its training prompts, the tokenizer, and the starting model (optionally SFT-warmed; with `eos`
    False it can no longer sample EOS). `vocab` pads the character vocabulary with filler characters to that size."""
    import torch

    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.models.decoders import use_cuda_graphs, use_sampler_dtype
    from posttrain.tasks import build_task
    from posttrain.runtime import seed_everything
    from posttrain.trainers.sft import train_sft

    seed_everything(cfg.pipeline.seed)
    task = build_task(cfg.task)
    train = task.splits(cfg.pipeline.seed)["train"]
    tokenizer = train_char_tokenizer([task.alphabet()])
    if vocab is not None and vocab > len(tokenizer):
        tokenizer = train_char_tokenizer([task.alphabet(), filler_characters(vocab - len(tokenizer), task.alphabet())])
        assert len(tokenizer) == vocab, (len(tokenizer), vocab)
    model = build_tiny(cfg.model, tokenizer)
    if sft_steps:
        sft_cfg = cfg.sft.model_copy(update={"steps": sft_steps, "warmup_steps": min(cfg.sft.warmup_steps, sft_steps)})
        pool = train[: cfg.sft.n_examples] if cfg.sft.n_examples else train
        train_sft(model, tokenizer, pool, sft_cfg, cfg.pipeline.seed, on_log=lambda step, metrics: None)
    model.zero_grad(set_to_none=True)
    use_cuda_graphs(model, cfg.model.cuda_graphs)  # our step's rollouts (`--set model.cuda_graphs=true`); TRL ignores it
    use_sampler_dtype(model, cfg.model.sampler_dtype)  # ours only, like cuda_graphs
    if not eos:
        eos_off(model, tokenizer.eos_token_id)
    return task, train, tokenizer, model.to(torch.device("cpu"))


def check_comparable(rl) -> None:
    problems = []
    if rl.advantage != "grpo" or rl.loss != "clip":
        problems.append(f"rl.advantage/rl.loss must be grpo/clip for a TRL GRPO peer (got {rl.advantage}/{rl.loss})")
    if rl.loss_agg not in LOSS_TYPE:
        problems.append(f"rl.loss_agg {rl.loss_agg!r} has no TRL loss_type counterpart")
    if rl.epochs_per_batch != 1:
        problems.append("rl.epochs_per_batch must be 1 (one optimizer step per generation on both sides)")
    if (rl.prompts_per_step * rl.group_size) % micro_batch(rl):
        problems.append(f"rl.micro_batch {rl.micro_batch} must divide the batch of {rl.prompts_per_step * rl.group_size} rows (TRL accumulates whole micro-batches)")
    unknown = {r.name for r in rl.rewards} - {"correctness", "format"}
    if unknown:
        problems.append(f"rewards {sorted(unknown)} have no TRL wrapper here")
    if problems:
        sys.exit("grpo_step: " + "; ".join(problems))


# -- ours ----------------------------------------------------------------------------------------------


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so a wall-clock interval covers it."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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
        self.rollout_seconds: list[float] = []  # the sampling part of each step (tokens / tokens_per_s)
        self.mismatch_k3: list[float] = []  # each step's sampler-vs-trainer k3 per token (`mismatch/k3`)
        self.device = next(model.parameters()).device
        self.peak_cuda_mib: float = 0.0
        model.train()

    def step(self) -> float:
        import torch

        synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        metrics = self.trainer.step(self.stream.take(self.run.cfg.prompts_per_step)).metrics
        synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.device.type == "cuda":
            self.peak_cuda_mib = max(self.peak_cuda_mib, torch.cuda.max_memory_allocated() / 2**20)
        self.completion_lengths.append(metrics["completion_length"])
        self.mismatch_k3.append(metrics.get("mismatch/k3", float("nan")))  # absent while only a critic trains
        rows = self.run.cfg.prompts_per_step * self.run.cfg.group_size
        self.rollout_seconds.append(metrics["completion_length"] * rows / metrics["tokens_per_s"])
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


def micro_batch(rl) -> int:
    """Rows per forward/backward pass of an update, both sides: rl.micro_batch, or the whole batch when it is 0."""
    batch = rl.prompts_per_step * rl.group_size
    return rl.micro_batch if 0 < rl.micro_batch < batch else batch


def trl_config(rl, seed: int, total_steps: int, out_dir: str, device: str = "cpu"):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out_dir,
        # the same objective and optimisation as ours
        # one optimizer step per generation batch, in ours' micro-batches (rl.micro_batch) when it has them: TRL generates
        # the whole batch (steps_per_generation = the accumulation steps), then runs forward/backward per micro-batch
        per_device_train_batch_size=micro_batch(rl),
        gradient_accumulation_steps=rl.prompts_per_step * rl.group_size // micro_batch(rl),
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
        # training in the model's own dtype (as ours: no autocast), nothing written or reported
        use_cpu=device == "cpu",
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


def make_interleaver(ours: OurLoop, threads: int, max_new_tokens: int, watch: RssWatch | None = None, device: str = "cpu"):
    import torch
    from transformers import TrainerCallback

    cuda = torch.device(device).type == "cuda"

    class Interleave(TrainerCallback):
        """Times each TRL optimizer step, then runs one of our steps outside TRL's interval."""

        def __init__(self):
            self.trl: list[float] = []
            self.ours: list[float] = []
            self.trl_lengths: list[float] = []
            self.trainer = None
            self.peak_cuda_mib = 0.0
            self.resume = time.perf_counter()

        def _trl_begins(self):
            if watch is not None:
                watch.begin("trl_step")
            synchronize(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            self.resume = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            self._trl_begins()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            self.trl.append(time.perf_counter() - self.resume)
            if cuda:
                self.peak_cuda_mib = max(self.peak_cuda_mib, torch.cuda.max_memory_allocated() / 2**20)
            if watch is not None:
                watch.end()
            logged = getattr(self.trainer, "_metrics", {}).get("train", {})
            lengths, longest = logged.get("completions/mean_length", []), logged.get("completions/max_length", [])
            self.trl_lengths.append(float(lengths[-1]) if lengths else float("nan"))
            if longest and longest[-1] > max_new_tokens:
                raise RuntimeError(f"TRL generated {longest[-1]} tokens, over the budget of {max_new_tokens}")
            if torch.get_num_threads() != threads:
                raise RuntimeError(f"torch threads changed to {torch.get_num_threads()} during TRL's step")
            with watch.call("ours_step") if watch is not None else contextlib.nullcontext():
                self.ours.append(ours.step())
            self._trl_begins()

    return Interleave()


def run_steps(cfg, task, train, tokenizer, model, total_steps: int, threads: int, watch: RssWatch | None = None,
              device: str = "cpu"):
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    rl = cfg.rl
    ours = OurLoop(cfg, task, train, tokenizer, copy.deepcopy(model).to(device))
    callback = make_interleaver(ours, threads, rl.max_new_tokens, watch, device)
    funcs, weights = trl_rewards(task, tokenizer, rl.rewards)
    args = trl_config(rl, cfg.pipeline.seed, total_steps, tempfile.mkdtemp(prefix="grpo_bench_trl_"), device)
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


def run_rollouts(cfg, train, tokenizer, model, repeats: int, device: str = "cpu", warmup: int = 2,
                 watch: RssWatch | None = None) -> dict[str, float]:
    """Median seconds of our `sample()` and of `model.generate` on the same prompts, alternated, on `device`;
    with `watch` (and `repeats` 0), one untimed call per side measures its peak memory instead."""
    import torch

    from posttrain.rollout.sampling import encode_prompts, sample

    rl = cfg.rl
    device = torch.device(device)
    model = copy.deepcopy(model).to(device).eval()
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in train[: rl.prompts_per_step]], device)
    generator = torch.Generator(device=device).manual_seed(cfg.pipeline.seed)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(cfg.pipeline.seed)
    rows, width = ids.shape[0] * rl.group_size, rl.max_new_tokens

    def ours(cuda_graph: bool = False) -> int:  # eos_id -1 never matches: every row runs the full budget
        out = sample(model, ids, mask, group_size=rl.group_size, max_new_tokens=width, eos_id=-1, pad_id=tokenizer.pad_token_id,
                     temperature=rl.temperature, generator=generator, cuda_graph=cuda_graph)
        return int(out.completion_mask.sum())

    def hf() -> int:  # eos_token_id=None: no stopping criterion on EOS
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, num_return_sequences=rl.group_size, max_new_tokens=width,
                temperature=rl.temperature, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
            )
        return int(out[:, ids.shape[1]:].numel())

    if watch is not None:
        memory = {}
        for name, fn in (("ours", ours), ("hf", hf)):
            with watch.call(f"{name}_rollout"):
                fn()
            memory[f"{name}_rollout_peak_mib"] = watch.peak_mib(f"{name}_rollout")
            memory[f"{name}_rollout_peak_rss_mib"] = watch.peak_rss_mib(f"{name}_rollout")
        return memory
    sides = [("ours", ours), ("hf", hf)]
    if device.type == "cuda":  # the decode step replayed as a CUDA graph (models/decoders.py), a third side
        sides.append(("ours_graph", partial(ours, cuda_graph=True)))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    graph_error = None
    for _ in range(warmup):
        for name, fn in list(sides):
            try:
                fn()
            except RuntimeError as error:  # a capture that fails drops that side; the others still count
                if name != "ours_graph":
                    raise
                graph_error = f"{type(error).__name__}: {error}".splitlines()[0]
                sides.remove((name, fn))
                del times[name]
                print(f"CUDA graph rollout failed, left out: {graph_error}", flush=True)
    for _ in range(repeats):
        for name, fn in sides:
            sync()
            start = time.perf_counter()
            produced = fn()  # its int() reads the result back, which waits for the device
            times[name].append(time.perf_counter() - start)
            assert produced == rows * width, f"{name} produced {produced} tokens, expected {rows * width}"
    ours_s, hf_s = median(times["ours"]), median(times["hf"])
    flops = rollout_flops(model, ids.shape[1], width, rows)
    result = {
        "ours_rollout_s": ours_s, "hf_rollout_s": hf_s,
        "ours_rollout_tok_s": rows * width / ours_s, "hf_rollout_tok_s": rows * width / hf_s,
        "rollout_ratio": hf_s / ours_s, "rollout_tokens": rows * width, "prompt_width": ids.shape[1],
        "rollout_flops": flops, "ours_rollout_flop_s": flops / ours_s, "hf_rollout_flop_s": flops / hf_s,
    }
    if graph_error:
        result["graph_error"] = graph_error
    if "ours_graph" in times:
        graph_s = median(times["ours_graph"])
        result.update({"ours_graph_rollout_s": graph_s, "ours_graph_rollout_tok_s": rows * width / graph_s,
                       "graph_rollout_ratio": hf_s / graph_s, "ours_graph_rollout_flop_s": flops / graph_s})
    return result


# -- main ----------------------------------------------------------------------------------------------


def load_config(args, extra: list[str] = ()):
    from posttrain import resolve

    # rl.steps sizes our LR schedule; TRL's max_steps is the same number, so both schedules match
    total_steps = args.warmup + args.steps
    return resolve.load(args.params, [*SHAPES[args.shape]["overrides"], *args.overrides, f"rl.steps={total_steps}", *extra])


def shape_summary(cfg, model, args) -> dict:
    rl = cfg.rl
    return {
        "shape": args.shape, "parameters": sum(p.numel() for p in model.parameters()), "linear_parameters": linear_parameters(model),
        "prompts_per_step": rl.prompts_per_step, "group_size": rl.group_size, "rows": rl.prompts_per_step * rl.group_size,
        "max_new_tokens": rl.max_new_tokens, "eos": args.eos, "sft_steps": args.sft_steps, "model": cfg.model.model_dump(mode="json"),
    }


def run_scaling(args, base_cfg, threads: int) -> dict:
    """Both sides' median step seconds vs completion length (at the shape's G) and vs group size (at the shape's
    length), at `--scaling-prompts` prompts per step, EOS off, random init, interleaved as in the main run."""
    points = [("length", n, {"rl.max_new_tokens": n}) for n in args.scaling_lengths]
    points += [("group", g, {"rl.group_size": g}) for g in args.scaling_groups]
    longest = max([*args.scaling_lengths, base_cfg.rl.max_new_tokens])
    rows = []
    for axis, value, update in points:
        steps = 1 + args.scaling_steps
        extra = [f"rl.prompts_per_step={args.scaling_prompts}", f"model.max_positions={longest + 64}", f"rl.steps={steps}",
                 *(f"{k}={v}" for k, v in update.items())]
        cfg = load_config(args, extra)
        task, train, tokenizer, model = build(cfg, 0, eos=False)
        callback, _ = run_steps(cfg, task, train, tokenizer, model, steps, threads)
        ours_s, trl_s = median(callback.ours[1:]), median(callback.trl[1:])
        rows.append({"axis": axis, "value": value, "group_size": cfg.rl.group_size, "max_new_tokens": cfg.rl.max_new_tokens,
                     "prompts_per_step": cfg.rl.prompts_per_step, "ours_step_s": ours_s, "trl_step_s": trl_s,
                     "step_ratio": ours_s / trl_s, "load_average": load_average()})
        print(f"scaling {axis}={value}: ours {ours_s:.3f}s  TRL {trl_s:.3f}s  ratio {ours_s / trl_s:.3f}", flush=True)
    return {"rows": rows, "steps_per_point": args.scaling_steps, "prompts_per_step": args.scaling_prompts}


def plot_scaling(scaling: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, axis, label in ((axes[0], "length", "completion length (tokens)"), (axes[1], "group", "group size G")):
        rows = [r for r in scaling["rows"] if r["axis"] == axis]
        xs = [r["value"] for r in rows]
        ax.plot(xs, [r["ours_step_s"] for r in rows], "o-", label="posttrain")
        ax.plot(xs, [r["trl_step_s"] for r in rows], "s-", label="TRL GRPOTrainer")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("step seconds (median)")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    import torch

    torch.set_num_threads(args.threads)
    total_steps = args.warmup + args.steps
    cfg = load_config(args)
    check_comparable(cfg.rl)
    rl = cfg.rl
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.dry_run:  # the shape only: config + model, no SFT, no TRL
        _, _, _, model = build(cfg, 0, eos=args.eos, vocab=args.vocab)
        summary = {"dry_run": True, **shape_summary(cfg, model, args)}
        print(json.dumps(summary))
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 0

    import transformers
    import trl

    load_start = load_average()
    started = time.perf_counter()
    device, cuda = args.device, args.device.startswith("cuda")
    task, train, tokenizer, model = build(cfg, args.sft_steps, eos=args.eos, vocab=args.vocab)
    # the roofline: the best matmul in the model's dtype on the device (a bf16 model's rollout and update against bf16's)
    roofline_dtype = cfg.model.dtype
    roofline = [matmul_roofline(args.roofline_n, device=device, dtype=roofline_dtype)]
    rollout = run_rollouts(cfg, train, tokenizer, model, args.rollout_repeats, device=device)
    roofline.append(matmul_roofline(args.roofline_n, device=device, dtype=roofline_dtype))
    # RSS says nothing of GPU memory: on a GPU each side's peak allocation is read from torch instead
    watch = None if cuda else RssWatch()  # after the timed rollouts: its poller never competes with them for the GIL
    callback, ours = run_steps(cfg, task, train, tokenizer, model, total_steps, args.threads, watch, device)
    if watch is not None:
        rollout.update(run_rollouts(cfg, train, tokenizer, model, 0, warmup=0, watch=watch))
        watch.close()
    skip = args.warmup
    ours_step, trl_step = median(callback.ours[skip:]), median(callback.trl[skip:])
    # each of our measured steps over the TRL step taken right before it: pairs a minute apart, so the box's drift between
    # the start and the end of a run (TRL's step moved 44 -> 58 s in one) largely cancels; the target reads step_ratio
    step_ratios = [o / t for o, t in zip(callback.ours[skip:], callback.trl[skip:])]
    peak_flop_s = max(roofline)
    # the update's model FLOPs utilisation: forward + backward (6 x matmul weights per token) over the tokens the
    # step trains on, each distinct prompt once and every completion, against the measured matmul peak; the time is
    # the step minus its rollout (scoring and the optimizer step stay in it), attention FLOPs are left out: a lower bound
    ours_update_s = median([s - r for s, r in zip(callback.ours[skip:], ours.rollout_seconds[skip:])])
    trained_tokens = rl.prompts_per_step * rollout["prompt_width"] + rl.prompts_per_step * rl.group_size * rl.max_new_tokens
    update_flops = 6 * linear_parameters(model) * trained_tokens * (1 + (rl.beta > 0) / 3)  # + a reference forward
    result = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "weights": "random init" if not args.sft_steps else f"random init + {args.sft_steps} SFT steps",
        "vocab_size": len(tokenizer),
        "ours_rollout_in_step_s": median(ours.rollout_seconds[skip:]),
        "ours_update_s": ours_update_s,
        "update_flops": update_flops,
        "update_mfu": update_flops / ours_update_s / peak_flop_s,
        "step_mfu_ours": update_flops / ours_step / peak_flop_s,
        "step_mfu_trl": update_flops / trl_step / peak_flop_s,
        "micro_batch": micro_batch(rl),  # rows per forward/backward pass of an update, both sides
        "ours_step_s": ours_step,
        "trl_step_s": trl_step,
        "step_ratio": ours_step / trl_step,
        "step_ratios": step_ratios,
        "step_ratio_paired": median(step_ratios),
        **rollout,
        "roofline_flop_s": peak_flop_s,
        "roofline_flop_s_before_after": roofline,
        "roofline_fraction": rollout["ours_rollout_flop_s"] / peak_flop_s,
        "hf_roofline_fraction": rollout["hf_rollout_flop_s"] / peak_flop_s,
        **({"ours_step_peak_cuda_mib": ours.peak_cuda_mib, "trl_step_peak_cuda_mib": callback.peak_cuda_mib} if cuda else {
            "ours_step_peak_mib": watch.peak_mib("ours_step"),
            "trl_step_peak_mib": watch.peak_mib("trl_step"),
            "ours_step_peak_rss_mib": watch.peak_rss_mib("ours_step"),
            "trl_step_peak_rss_mib": watch.peak_rss_mib("trl_step"),
        }),
        "ours_completion_length": median(ours.completion_lengths[skip:]),
        "ours_mismatch_k3": median(ours.mismatch_k3[skip:]),  # the sampler (decode loop) against the training forward
        "trl_completion_length": median(callback.trl_lengths[skip:]),
        "ours_step_times_s": callback.ours,
        "trl_step_times_s": callback.trl,
        "targets": {"step_ratio_max": STEP_TARGET, "rollout_ratio_min": ROLLOUT_TARGET, "roofline_fraction_min": ROOFLINE_TARGET},
        "settings": {
            "threads": args.threads, "steps": args.steps, "warmup": args.warmup, "rollout_repeats": args.rollout_repeats,
            "sft_steps": args.sft_steps, "prompts_per_step": rl.prompts_per_step, "group_size": rl.group_size,
            "max_new_tokens": rl.max_new_tokens, "eos": args.eos, "temperature": rl.temperature, "lr": rl.lr, "beta": rl.beta,
            "clip_eps": [rl.clip_eps_low, rl.clip_eps_high], "loss_agg": rl.loss_agg, "trl_loss_type": LOSS_TYPE[rl.loss_agg],
            "std_scaling": rl.std_scaling, "model": cfg.model.model_dump(mode="json"), "roofline_n": args.roofline_n,
            "roofline_dtype": roofline_dtype, "device": device,
            "optimizers": {"ours": "torch.optim.AdamW (defaults)", "trl": f"{callback.optim} ({callback.optimizer})"},
            "parameters": sum(p.numel() for p in model.parameters()), "linear_parameters": linear_parameters(model),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        },
    }
    if not args.eos:  # EOS off: both sides must have run every completion to the budget
        for side in ("ours", "trl"):
            if result[f"{side}_completion_length"] != rl.max_new_tokens:
                raise RuntimeError(f"EOS is off but {side}'s median completion length is {result[f'{side}_completion_length']}")
    if cuda:
        best_tok_s = max(rollout["ours_rollout_tok_s"], rollout.get("ours_graph_rollout_tok_s", 0.0))
        result["gpu_targets"] = {"step_ratio_max": GPU_STEP_TARGET, "rollout_tok_s_min": GPU_ROLLOUT_TOK_S_TARGET,
                                 "update_mfu_min": GPU_MFU_TARGET, "applies_to_shape": "anchor"}
        result["gpu_step_target_met"] = result["step_ratio"] <= GPU_STEP_TARGET
        result["gpu_rollout_target_met"] = best_tok_s >= GPU_ROLLOUT_TOK_S_TARGET
        result["gpu_mfu_target_met"] = result["update_mfu"] >= GPU_MFU_TARGET
    result["step_target_met"] = result["step_ratio"] <= STEP_TARGET
    result["rollout_target_met"] = result["rollout_ratio"] >= ROLLOUT_TARGET
    result["roofline_target_met"] = result["roofline_fraction"] >= ROOFLINE_TARGET

    n, width = rl.prompts_per_step * rl.group_size, rl.max_new_tokens
    print(f"\nGRPO step, shape {args.shape}: {rl.prompts_per_step} prompts x G={rl.group_size}, <= {width} new tokens "
          f"(EOS {'on' if args.eos else 'off'}), {result['settings']['parameters']:,} params, {args.threads} thread(s); "
          f"medians of {args.steps} interleaved steps after {args.warmup} warm-up; {result['device']}, {cfg.model.dtype}; "
          f"load average {load_start}")
    print(f"{'':28}{'posttrain':>14}{'peer':>14}{'ratio':>9}  target")
    print(f"{'step seconds (vs TRL)':28}{ours_step:>14.4f}{trl_step:>14.4f}{result['step_ratio']:>9.3f}  <= {STEP_TARGET}"
          f"  {'met' if result['step_target_met'] else 'MISSED'}")
    print(f"{'  median of per-step ratios':28}{'':28}{result['step_ratio_paired']:>9.3f}   (each of our steps over the TRL step before it)")
    print(f"{'rollout tok/s (vs generate)':28}{rollout['ours_rollout_tok_s']:>14,.0f}{rollout['hf_rollout_tok_s']:>14,.0f}"
          f"{rollout['rollout_ratio']:>9.3f}  >= {ROLLOUT_TARGET}  {'met' if result['rollout_target_met'] else 'MISSED'}")
    print(f"{'rollout seconds':28}{rollout['ours_rollout_s']:>14.4f}{rollout['hf_rollout_s']:>14.4f}"
          f"   ({n} rows x {width} tokens, EOS off)")
    print(f"{'rollout GFLOP/s (roofline)':28}{rollout['ours_rollout_flop_s'] / 1e9:>14.1f}{rollout['hf_rollout_flop_s'] / 1e9:>14.1f}"
          f"{result['roofline_fraction']:>9.3f}  >= {ROOFLINE_TARGET}  {'met' if result['roofline_target_met'] else 'MISSED'}"
          f"  (of {peak_flop_s / 1e9:.1f} GFLOP/s, {args.roofline_n}^3 {roofline_dtype} matmul)")
    if "ours_graph_rollout_tok_s" in rollout:
        print(f"{'rollout tok/s, CUDA graphs':28}{rollout['ours_graph_rollout_tok_s']:>14,.0f}{rollout['hf_rollout_tok_s']:>14,.0f}"
              f"{rollout['graph_rollout_ratio']:>9.3f}")
    print(f"{'update MFU (step - rollout)':28}{result['update_mfu']:>14.3f}{'':>14}{'':>9}  ({result['ours_update_s']:.3f}s of "
          f"{ours_step:.3f}s; {update_flops / 1e12:.2f} TFLOP)")
    if cuda:
        print(f"{'step peak CUDA memory MiB':28}{result['ours_step_peak_cuda_mib']:>14.1f}{result['trl_step_peak_cuda_mib']:>14.1f}")
    else:
        print(f"{'step peak memory MiB':28}{result['ours_step_peak_mib']:>14.1f}{result['trl_step_peak_mib']:>14.1f}"
              "   (RSS rise over a call, max)")
        print(f"{'rollout peak memory MiB':28}{rollout['ours_rollout_peak_mib']:>14.1f}{rollout['hf_rollout_peak_mib']:>14.1f}")
    print(f"{'sampler-trainer k3 / token':28}{result['ours_mismatch_k3']:>14.2e}{'':>14}{'':>9}  (`mismatch/k3`, median over the steps)")
    print(f"{'completion length in steps':28}{result['ours_completion_length']:>14.2f}{result['trl_completion_length']:>14.2f}"
          f"   (EOS {'on: either side may stop early' if args.eos else 'off'})")
    if args.scaling:
        result["scaling"] = run_scaling(args, cfg, args.threads)
        figure = args.figure or args.json.with_suffix(".png")
        plot_scaling(result["scaling"], figure, f"GRPO step vs length and group size, shape {args.shape}, "
                     f"{args.scaling_prompts} prompts, {args.threads} thread(s)")
        result["scaling"]["figure"] = str(figure)
    result["load_average"] = {"start": load_start, "end": load_average()}
    result["wall_s"] = time.perf_counter() - started
    print(f"load average {load_start} -> {result['load_average']['end']}; wall {result['wall_s']:.1f}s -> {args.json}")
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
