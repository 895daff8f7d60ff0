"""The library on a CUDA device: every estimator x loss trains there, the GPU agrees with the CPU, the
rollout's recorded log-probs equal the training forward's (ratio 1 on the first update), SFT learns, and
an RL run resumed from its checkpoint continues exactly as the uninterrupted run.

Run on a GPU machine: `make test-gpu` (CPU CI never collects this folder)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "smoke"))
import test_objectives_smoke as smoke  # noqa: E402  (the CPU smoke matrix, reused on the GPU)

from posttrain.models.logprobs import completion_logprobs  # noqa: E402
from posttrain.rollout.sampling import encode_prompts, sample  # noqa: E402
from posttrain.trainers.online_rl import RLRun  # noqa: E402
from posttrain.trainers.rl import train_online_rl  # noqa: E402
from posttrain.trainers.sft import train_sft  # noqa: E402


def on(device: torch.device, micro: tuple) -> tuple:
    cfg, task, examples, tokenizer, state, model = micro
    return cfg, task, examples, tokenizer, {k: v.to(device) for k, v in state.items()}, model.to(device)


@pytest.fixture(scope="module")
def cuda_micros(tmp_path_factory, cuda_device):
    built: dict[str, tuple] = {}

    def get(task_name: str):
        if task_name not in built:
            built[task_name] = on(cuda_device, smoke.build_micro(tmp_path_factory.mktemp(task_name), task_name))
        return built[task_name]

    return get


@pytest.mark.parametrize("advantage,loss", smoke.COMBOS)
def test_every_estimator_and_loss_trains_on_cuda(cuda_micros, cuda_device, advantage, loss):
    micro = cuda_micros(smoke.task_for(advantage))
    history = smoke.two_steps(micro, advantage=advantage, loss=loss)
    for metrics in history:
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert all(p.device.type == cuda_device.type for p in micro[-1].parameters())


def prompts_and_samples(micro, device, greedy: bool, generator=None, cuda_graph: bool = False):
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in examples[:8]], device)
    out = sample(model, ids, mask, group_size=4, max_new_tokens=8, eos_id=tokenizer.eos_token_id,
                 pad_id=tokenizer.pad_token_id, greedy=greedy, generator=generator, cuda_graph=cuda_graph)
    return ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0), out  # one prompt row per completion


def test_rollout_logprobs_equal_the_training_forward_on_cuda(cuda_micros, cuda_device):
    """Ratio = 1 at the first update needs the KV-cached sampler and the training forward to agree."""
    micro = cuda_micros("arithmetic")
    generator = torch.Generator(device=cuda_device).manual_seed(0)
    ids, mask, out = prompts_and_samples(micro, cuda_device, greedy=False, generator=generator)
    logp, _ = completion_logprobs(micro[-1], ids, mask, out.completion_ids, out.completion_mask)
    produced = out.completion_mask.bool()
    assert torch.allclose(logp[produced], out.logp[produced], atol=1e-4), (logp - out.logp)[produced].abs().max()


def test_cuda_graph_rollout_matches_the_plain_decoder(cuda_micros, cuda_device):
    """The decode step replayed as a CUDA graph (models/decoders.py, `model.cuda_graphs`) gives the plain step's
    greedy tokens and log-probs, and its recorded log-probs equal the training forward's."""
    micro = cuda_micros("arithmetic")
    ids, mask, plain = prompts_and_samples(micro, cuda_device, greedy=True)
    _, _, graphed = prompts_and_samples(micro, cuda_device, greedy=True, cuda_graph=True)
    assert torch.equal(graphed.completion_ids, plain.completion_ids)
    produced = graphed.completion_mask.bool()
    assert torch.allclose(graphed.logp[produced], plain.logp[produced], atol=1e-4)
    logp, _ = completion_logprobs(micro[-1], ids, mask, graphed.completion_ids, graphed.completion_mask)
    assert torch.allclose(logp[produced], graphed.logp[produced], atol=1e-4), (logp - graphed.logp)[produced].abs().max()


def test_cuda_log_probs_match_the_cpu(cuda_micros, cuda_device):
    micro = cuda_micros("arithmetic")
    ids, mask, out = prompts_and_samples(micro, cuda_device, greedy=True)
    gpu, _ = completion_logprobs(micro[-1], ids, mask, out.completion_ids, out.completion_mask)
    cpu_model = micro[-1].to("cpu")
    try:
        cpu, _ = completion_logprobs(cpu_model, ids.cpu(), mask.cpu(), out.completion_ids.cpu(), out.completion_mask.cpu())
    finally:
        micro[-1].to(cuda_device)
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-4), (gpu.cpu() - cpu).abs().max()


def test_sft_learns_on_cuda(cuda_micros, cuda_device):
    cfg, task, examples, tokenizer, state, model = cuda_micros("arithmetic")
    model.load_state_dict(state)
    logged: list[float] = []
    sft = cfg.sft.model_copy(update={"steps": 60, "log_every": 10})
    train_sft(model, tokenizer, list(examples), sft, seed=0, on_log=lambda step, m: logged.append(m["sft_loss"]))
    assert all(p.device.type == cuda_device.type for p in model.parameters())
    assert logged[-1] < 0.8 * logged[0], logged


class Interrupted(Exception):
    pass


def test_rl_resume_on_cuda_continues_the_uninterrupted_run(cuda_micros, tmp_path):
    cfg, task, examples, tokenizer, state, model = cuda_micros("arithmetic")
    rl = cfg.rl.model_copy(update={"steps": 4, "checkpoint_every": 2, "log_every": 1})

    def run(directory, resume: bool, stop_at: int | None = None):
        model.load_state_dict(state)
        torch.manual_seed(0)

        def on_log(step, metrics):
            if step == stop_at:  # dies during step 3: the step-2 checkpoint is the last one written
                raise Interrupted

        run = RLRun(model, tokenizer, task, list(examples), rl, seed=0, checkpoint_dir=directory, config_hash="gpu")
        return train_online_rl(run, resume, on_log)[0]

    torch.use_deterministic_algorithms(True)
    try:
        straight = run(tmp_path / "straight", resume=False)
        with pytest.raises(Interrupted):
            run(tmp_path / "resumed", resume=False, stop_at=3)
        resumed = run(tmp_path / "resumed", resume=True)
    finally:
        torch.use_deterministic_algorithms(False)
    timing = {"tokens_per_s", "step_seconds"}
    assert [{k: v for k, v in m.items() if k not in timing} for m in resumed] == [
        {k: v for k, v in m.items() if k not in timing} for m in straight
    ]
