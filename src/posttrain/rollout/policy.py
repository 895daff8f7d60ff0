"""The `Policy` protocol: what online RL (trainers/online_rl.py's `OnlineRL.step`) needs of the model it trains.

    encode(prompts, device) -> Prompts        token ids and mask, plus any per-prompt inputs beyond the text (images)
    generate(prompts, ...) -> Samples         `group_size` completions per prompt, prompt-major, log-probs recorded
    decode(samples, stop) -> list             what the rewards read of each completion: its produced text
    forward(batch, temperature, ...) -> PolicyOutputs   completion log-probs under the current weights (with gradient)
    over(model) -> Policy                     the same policy over another copy of the model (the frozen reference)

`model` is the module an update changes (optimised, checkpointed, reduced across ranks). The trainer copies a
prompt's `inputs` onto each of its samples as `batch.extras` under the same names, and what `generate` recorded per
sample beyond its tokens (`Samples.extras`) under its own, so `forward` finds them on the batch, micro-batches and
dynamic sampling's kept groups included.

A "completion token" is whatever step the policy takes and scores: a text token, or one recorded transition of a
sampler whose steps have densities (a flow model's SDE denoising steps: recipes/image/policy.py); `decode` gives the
rewards one object per sample (text for a language model; the rewards registered for that policy's task read it).
A policy may also supply its own KL to the frozen reference, used for the rl.beta term instead of the k3 estimate on
the sampled tokens' log-probs (closed forms, where the model has them):

    kl(outputs, reference) -> Tensor [B, T]   per-token KL of this forward's outputs to the reference's on the batch

`CausalLMPolicy` is the language-model path (chat template, the rollout engine with stop strings or a multi-turn
task's episode sampler, one forward over prompt + completion); a recipe brings its own for another kind of model
(VisKG's vision-language model: recipes/viskg/policy.py; MotionInsight's evaluator: recipes/motion/policy.py). A policy
that is not a causal LM gives the completion log-probs only, its own and its frozen reference's (the `ref_logp` of the
KL term, through `over`): parts that read full distributions, hidden states, other providers' extras, or another
sampler are refused up front by the trainer; such a policy says so (`log_probs_only = True`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from posttrain.models.logprobs import completion_forward
from posttrain.rollout.batch import PolicyOutputs, RolloutBatch
from posttrain.rollout.sampling import Samples, StopStrings, decode_completions, encode_prompts, sample

if TYPE_CHECKING:
    from posttrain.tasks import Example


@dataclass(frozen=True)
class Prompts:
    ids: Tensor  # [N, P] left-padded prompt token ids
    mask: Tensor  # [N, P] 1 on real prompt tokens
    inputs: Mapping[str, Tensor] = field(default_factory=dict)  # per-prompt inputs beyond the text, [N, ...] (images)


@runtime_checkable
class Policy(Protocol):
    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    log_probs_only: bool  # `forward` gives completion log-probs and nothing else (no full distributions, hidden states)

    def encode(self, prompts: Sequence[Example], device: torch.device) -> Prompts:
        """The prompts as the model reads them."""

    def generate(self, prompts: Prompts, *, group_size: int, max_new_tokens: int, temperature: float,
                 generator: torch.Generator, stop: StopStrings | None) -> Samples:
        """`group_size` sampled completions per prompt (rows prompt-major), each token's log-prob recorded at `temperature`."""

    def decode(self, samples: Samples, stop: StopStrings | None) -> list[Any]:
        """What the rewards read of each completion: the text it produced (cut before a stop string) for a language model."""

    def forward(self, batch: RolloutBatch, temperature: float, *, full: bool = False, hidden: bool = False,
                entropy: bool = False) -> PolicyOutputs:
        """The batch's completion log-probs at `temperature` under the current weights (and, where the model gives them,
        the full distributions, hidden states and entropy asked for)."""

    def over(self, model: nn.Module) -> Policy:
        """The same policy over another copy of the model (the frozen reference of the KL term)."""


class CausalLMPolicy:
    """A transformers causal LM and its tokenizer: the path every core RL run takes. `episodes(tokenizer)`, when given,
    is a multi-turn task's episode sampler (an environment feeds observations between the policy's turns)."""

    log_probs_only = False

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase,
                 episodes: Callable[[PreTrainedTokenizerBase], Callable[..., Samples]] | None = None):
        self.model, self.tokenizer, self.episodes = model, tokenizer, episodes

    def encode(self, prompts: Sequence[Any], device: torch.device) -> Prompts:
        ids, mask = encode_prompts(self.tokenizer, prompts, device)  # the chat template's, when there is one
        return Prompts(ids, mask)

    def generate(self, prompts: Prompts, *, group_size: int, max_new_tokens: int, temperature: float,
                 generator: torch.Generator, stop: StopStrings | None) -> Samples:
        tok = self.tokenizer  # multi-turn envs sample whole episodes, by their own stop rules
        draw = self.episodes(tok) if self.episodes is not None else partial(sample, stop=stop or None)
        return draw(self.model, prompts.ids, prompts.mask, group_size=group_size, max_new_tokens=max_new_tokens,
                    eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=temperature, generator=generator)

    def decode(self, samples: Samples, stop: StopStrings | None) -> list[str]:
        return decode_completions(self.tokenizer, samples, stop)

    def forward(self, batch: RolloutBatch, temperature: float, *, full: bool = False, hidden: bool = False,
                entropy: bool = False) -> PolicyOutputs:
        out = completion_forward(self.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask,
                                 temperature, full=full, hidden=hidden, entropy=entropy)
        return PolicyOutputs(logp=out.logp, entropy=out.entropy, logprobs=out.logprobs, hidden=out.hidden)

    def over(self, model: nn.Module) -> CausalLMPolicy:
        return CausalLMPolicy(model, self.tokenizer, self.episodes)
