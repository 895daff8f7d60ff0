"""Flow-GRPO on the core RL step (trainers/online_rl.py's `OnlineRL.step`): the conditional flow model's denoising
chain as a `Policy` (rollout/policy.py), the training edits as the run's task, and the image judges as registered
rewards (recipes/image/rewards.py).

Liu et al. 2025, "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv 2505.05470: sampling with the SDE of
eq. 9-11 makes every denoising step a Gaussian transition pi_theta(x_{j+1} | x_j, c) with a known log-density
(objectives/flow_grpo.py). The J = int(timestep_fraction * sampling_steps) leading SDE steps are the completion's
tokens; the Euler tail has no density and is not trained (Flow-GRPO's timestep_fraction).

- `FlowPolicy.generate` samples `group_size` chains per edit (`sample_sde`), recording each chain's states
  x_0 .. x_J (`Samples.extras["states"]`, [N, J + 1, *latent]) and final latent (`["final"]`); its tokens are J
  placeholders under a mask of ones, their log-probs the transitions' (old_logp [N, J]).
- `FlowPolicy.forward` re-scores each recorded transition x_j -> x_{j+1} under the current weights, one model call
  per step over the batch as at sampling (so the first pass reproduces old_logp exactly: ratio 1): logp [B, J] with
  gradient, and the step means [B, J, *latent] the KL reads.
- `FlowPolicy.kl` is this policy's own KL term (the core uses it for rl.beta instead of the k3 estimate): the closed
  form between the step's Gaussians under the policy and the frozen SFT model, which share their variance (eq. 12):
  ||mu_theta - mu_ref||^2 / (2 s_j^2), averaged over latent dims; 0 on a step without noise.
- `FlowPolicy.decode` gives each sample's final image in [0, 1] (not clipped, so out-of-range pixels count against
  QP); the rewards `ia`, `bp`, `qp` read them with the edits through `FlowTask`.

A prompt is one edit: a placeholder token, its encoded conditions and its instruction (as UTF-8 bytes, encoded by the
model where it runs: a text encoding need not be one tensor with a row per prompt) as the prompts' `inputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.objectives.flow_grpo import gaussian_kl, sde_step, step_scale
from posttrain.recipes.image.settings import FlowRLConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.rollout import PolicyOutputs, RolloutBatch
from posttrain.rollout.policy import Prompts
from posttrain.rollout.sampling import Samples, StopStrings
from posttrain.tasks import Example

CONDITIONS, INSTRUCTION, STATES, FINAL = "conditions", "instruction", "states", "final"  # batch extras


def sigma_schedule(steps: int) -> list[float]:
    """The flow-matching sigmas from 1 (noise) to 0, as diffusers' FlowMatchEulerDiscreteScheduler sets them."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(steps)
    return [float(s) for s in scheduler.sigmas]


def stochastic_steps(cfg: FlowRLConfig) -> int:
    """How many leading denoising steps are sampled with noise and trained on (Flow-GRPO's timestep_fraction)."""
    return max(1, int(cfg.timestep_fraction * cfg.sampling_steps))


@dataclass(frozen=True)
class Trajectory:
    states: Tensor  # [J + 1, B, *latent] x at every sigma, states[0] the initial noise
    logp: Tensor  # [J, B] log-prob of each recorded transition at sampling time
    final: Tensor  # [B, *latent] the final sample (pixels in [-1, 1] for the UNet; decode with model.from_latent)


@torch.no_grad()
def sample_sde(model, conditions: Tensor, text, sigmas: list[float], noise_level: float, generator: torch.Generator,
               stochastic: int | None = None) -> Trajectory:
    """SDE steps for the first `stochastic` steps (all by default), then Euler steps: in pixel space the noise
    injected by a late SDE step would stay in the image, while the ODE tail denoises it (the SDE keeps the
    marginals, so the state entering the tail is a proper sample at its noise level)."""
    x = torch.randn(model.latent_shape(conditions.shape[0]), generator=generator)
    states, logps = [x], []
    stochastic = len(sigmas) - 1 if stochastic is None else stochastic
    for j, (sigma, sigma_prev) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        level = noise_level if j < stochastic else 0.0
        step = sde_step(x, model(x, torch.tensor(sigma), conditions, text), sigma, sigma_prev, level, sigmas[1], generator=generator)
        x = step.prev
        states.append(x)
        logps.append(step.logp)
    return Trajectory(torch.stack(states), torch.stack(logps), x)


def instruction_bytes(texts: Sequence[str]) -> Tensor:
    """[N, L] the UTF-8 bytes of each instruction, 0-padded: a string per row that rides on a tensor batch."""
    encoded = [t.encode() for t in texts]
    out = torch.zeros(len(encoded), max((len(e) for e in encoded), default=0) + 1, dtype=torch.uint8)
    for row, data in enumerate(encoded):
        out[row, : len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return out


def instructions(rows: Tensor) -> list[str]:
    return [bytes(row.tolist()).rstrip(b"\0").decode() for row in rows]


@dataclass(frozen=True)
class FlowOutputs(PolicyOutputs):
    mean: Tensor | None = None  # [B, J, *latent] each recorded step's Gaussian mean under the forward's weights


class FlowPolicy:
    """A conditional flow model's SDE denoising chain as the `Policy` of an RL run (see the module docstring). The
    trainer's temperature and max_new_tokens do not apply: the chain's length and noise are `cfg`'s."""

    log_probs_only = True
    tokenizer = None  # no text tokens: prompts and completions are placeholders

    def __init__(self, model, cfg: FlowRLConfig):
        self.model, self.cfg = model, cfg
        self.sigmas, self.steps = sigma_schedule(cfg.sampling_steps), stochastic_steps(cfg)

    def over(self, model) -> FlowPolicy:
        return FlowPolicy(model, self.cfg)

    def encode(self, prompts: Sequence[Example], device: torch.device) -> Prompts:
        conditions = self.model.encode_conditions(torch.stack([e.metadata[CONDITIONS] for e in prompts]))
        ids = torch.zeros(len(prompts), 1, dtype=torch.long, device=device)
        return Prompts(ids, torch.ones_like(ids), {CONDITIONS: conditions, INSTRUCTION: instruction_bytes([e.prompt for e in prompts])})

    def generate(self, prompts: Prompts, *, group_size: int, max_new_tokens: int, temperature: float,
                 generator: torch.Generator, stop: StopStrings | None) -> Samples:
        rows = lambda t: t.repeat_interleave(group_size, 0)  # noqa: E731  (prompt-major: edit i's samples are rows i*G ..)
        conditions, text = rows(prompts.inputs[CONDITIONS]), self.model.encode_text(instructions(rows(prompts.inputs[INSTRUCTION])))
        chain = sample_sde(self.model, conditions, text, self.sigmas, self.cfg.noise_level, generator, self.steps)
        n, steps = conditions.shape[0], self.steps
        return Samples(
            completion_ids=torch.zeros(n, steps, dtype=torch.long), completion_mask=torch.ones(n, steps, dtype=torch.long),
            logp=chain.logp[:steps].T.contiguous(), finished=torch.ones(n, dtype=torch.bool),
            extras={STATES: chain.states[: steps + 1].transpose(0, 1).contiguous(), FINAL: chain.final},
        )

    def decode(self, samples: Samples, stop: StopStrings | None) -> list[Tensor]:
        return list((self.model.from_latent(samples.extras[FINAL]) + 1) / 2)

    def forward(self, batch: RolloutBatch, temperature: float, *, full: bool = False, hidden: bool = False,
                entropy: bool = False) -> FlowOutputs:
        states, conditions = batch.extras[STATES], batch.extras[CONDITIONS]
        text = self.model.encode_text(instructions(batch.extras[INSTRUCTION]))
        logps, means = [], []
        for j, (sigma, sigma_prev) in enumerate(zip(self.sigmas[: self.steps], self.sigmas[1 : self.steps + 1])):
            x = states[:, j]
            step = sde_step(x, self.model(x, torch.tensor(sigma), conditions, text), sigma, sigma_prev, self.cfg.noise_level, self.sigmas[1],
                            prev=states[:, j + 1])
            logps.append(step.logp)
            means.append(step.mean)
        return FlowOutputs(logp=torch.stack(logps, dim=1), mean=torch.stack(means, dim=1))

    def kl(self, outputs: FlowOutputs, reference: FlowOutputs) -> Tensor:
        """[B, J] the closed-form KL of each recorded step's Gaussian to the reference's (module docstring)."""
        columns = []
        for j, (sigma, sigma_prev) in enumerate(zip(self.sigmas[: self.steps], self.sigmas[1 : self.steps + 1])):
            scale = step_scale(sigma, sigma_prev, self.cfg.noise_level, self.sigmas[1])
            mean = outputs.mean[:, j]
            columns.append(gaussian_kl(mean, reference.mean[:, j], torch.tensor(scale)) if scale > 0 else mean.new_zeros(mean.shape[0]))
        return torch.stack(columns, dim=1)


class FlowTask:
    """The training edits as an RL run's task: the judges' view of each sample's edit (example.metadata["edit"]
    indexes `edits`)."""

    def __init__(self, edits: Edits):
        self.edits = edits

    def examples(self) -> list[Example]:
        return [Example(prompt=self.edits.instructions[i], completion="", answer="",
                        metadata={"edit": i, CONDITIONS: self.edits.conditions[i]}) for i in range(len(self.edits))]

    def judged(self, examples: Sequence[Example]):
        return self.edits.take([e.metadata["edit"] for e in examples]).judged()
