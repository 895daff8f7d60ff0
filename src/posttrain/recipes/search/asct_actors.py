"""ASCT's actors (specs/seed_methods.md §24; recipes/search/asct_trainer.py), registry `asct actors`, chosen by `asct.actor`:

    lm   the language model is the policy (the `model` section: a tiny char-level causal LM, warm-started on the
         environment's reference transcripts). At a recoverable state s, the prefix text x(s) (the question, every
         earlier `<search>q</search>` with its `<result>...</result>` observation) is what the LM reads; a legal
         action a is the text y(a) the LM would write next (`<search>q</search>` or `<answer>x</answer>`), and
             pi(a | s) = exp(log p_LM(y(a) | x(s))) / sum_{b in A(s)} exp(log p_LM(y(b) | x(s)))
         with log p_LM(y | x) the sum of y's token log-probabilities (teacher-forced, one forward over all of A(s)).
         The legal set is the environment's (the candidate next queries over the entities read, and answering now
         with an entity of a retrieved passage): the LM's distribution restricted to it and renormalised, which is
         the policy whose probabilities pi_0 centre ASCT's table.
    mlp  a small network scoring each legal action from the environment's hand-made features (the earlier actor).

Every actor is an nn.Module with one interface: `distribution(env, state, actions)` (no gradient; a frozen copy
memoises it per state, since pi_0 does not change within an iteration), `extra_tokens` (tokens it scores besides the
ones it writes: the LM scores every legal action's text, so a simulation's auxiliary tokens count them),
`prepare(env, visits)` + `log_probs(batch)` (the legal-set log-probabilities of the visited states, with gradient,
for PPO), `learning_rate(cfg)`, `frozen()`, `warm_start(env, train, cfg, seed)` and `save(dir)`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from posttrain.recipes.search.recoverable import RecoverableEnv
from posttrain.errors import UserError
from posttrain.registry import Registry

actors: Registry = Registry("asct actor")


class Actor(nn.Module):
    """Scores each legal action from its features; the policy is the softmax over a state's legal actions."""

    def __init__(self, n_features: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, features: Tensor, legal: Tensor | None = None) -> Tensor:
        """Log-probabilities [..., A] from features [..., A, F]; `legal` [..., A] masks padding actions."""
        scores = self.net(features).squeeze(-1)
        if legal is not None:
            scores = scores.masked_fill(~legal, float("-inf"))
        return torch.log_softmax(scores, dim=-1)

    @torch.no_grad()
    def distribution(self, env: RecoverableEnv, state, actions: list) -> Tensor:
        return self(env.features(state, actions)).exp()

    def extra_tokens(self, env: RecoverableEnv, state, actions: list, index: int) -> int:
        return 0

    def prepare(self, env: RecoverableEnv, visits: Sequence) -> tuple[Tensor, Tensor]:
        feats = [env.features(v.state, env.legal_actions(v.state)) for v in visits]
        width = max(f.shape[0] for f in feats)
        features = torch.zeros(len(feats), width, feats[0].shape[1])
        legal = torch.zeros(len(feats), width, dtype=torch.bool)
        for i, f in enumerate(feats):
            features[i, : f.shape[0]], legal[i, : f.shape[0]] = f, True
        return features, legal

    def log_probs(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        features, legal = batch
        return self(features, legal), legal

    def learning_rate(self, cfg) -> float:
        return cfg.lr

    def frozen(self) -> "Actor":
        return copy.deepcopy(self).requires_grad_(False).eval()

    def warm_start(self, env, train, cfg, seed: int) -> None:
        """The MLP starts from scratch."""

    def save(self, out: Path) -> None:
        """`out/model.safetensors` and `out/actor.json` (its shape)."""
        from safetensors.torch import save_model

        out.mkdir()
        save_model(self, str(out / "model.safetensors"))
        shape = {"actor": "mlp", "n_features": self.net[0].in_features, "hidden_size": self.net[0].out_features}
        (out / "actor.json").write_text(json.dumps(shape) + "\n")


class LMActor(nn.Module):
    """The language model as ASCT's actor: the legal-set-normalised sequence probabilities of the actions' texts."""

    def __init__(self, lm: nn.Module, tokenizer, score_batch: int):
        super().__init__()
        self.lm, self.tokenizer, self.score_batch = lm, tokenizer, score_batch
        self.cache: dict[Any, Tensor] | None = None  # a frozen actor's pi_0 per (state, legal actions)
        self._ids: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = self.tokenizer(text, add_special_tokens=False).input_ids
        return self._ids[text]

    def rows(self, env: RecoverableEnv, state, actions: list) -> list[tuple[list[int], list[int]]]:
        prefix = self.ids(env.text(state))
        rows = [(prefix, self.ids(env.action_text(a))) for a in actions]
        longest = len(prefix) + max(len(r[1]) for r in rows)
        if longest > self.lm.config.max_position_embeddings:
            raise UserError(f"asct.actor lm: a state's text and action take {longest} tokens, over model.max_positions = "
                            f"{self.lm.config.max_position_embeddings}: raise model.max_positions")
        return rows

    def sequence_logp(self, rows: Sequence[tuple[list[int], list[int]]]) -> Tensor:
        """[N] log p_LM(action | prefix), the action's token log-probs summed; rows in chunks of `score_batch`."""
        from posttrain.models.logprobs import completion_forward

        out = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(rows), self.score_batch):
            chunk = rows[start : start + self.score_batch]
            p_width, c_width = max(len(p) for p, _ in chunk), max(len(c) for _, c in chunk)
            prompt = torch.full((len(chunk), p_width), pad)
            prompt_mask = torch.zeros((len(chunk), p_width), dtype=torch.long)
            completion = torch.full((len(chunk), c_width), pad)
            completion_mask = torch.zeros((len(chunk), c_width), dtype=torch.long)
            for i, (p, c) in enumerate(chunk):  # prompts left-padded, completions right-padded
                prompt[i, p_width - len(p) :], prompt_mask[i, p_width - len(p) :] = torch.tensor(p), 1
                completion[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
            logp = completion_forward(self.lm, prompt, prompt_mask, completion, completion_mask).logp
            out.append((logp * completion_mask).sum(1))
        return torch.cat(out)

    def distribution(self, env: RecoverableEnv, state, actions: list) -> Tensor:
        key = (state, tuple(actions))
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        with torch.no_grad():
            probs = torch.softmax(self.sequence_logp(self.rows(env, state, actions)), 0)
        if self.cache is not None:
            self.cache[key] = probs
        return probs

    def extra_tokens(self, env: RecoverableEnv, state, actions: list, index: int) -> int:
        """The tokens of the legal actions other than the one written: the LM scores each to choose."""
        return sum(len(self.ids(env.action_text(a))) for i, a in enumerate(actions) if i != index)

    def prepare(self, env: RecoverableEnv, visits: Sequence) -> tuple[list, list[int]]:
        rows, sizes = [], []
        for v in visits:
            r = self.rows(env, v.state, env.legal_actions(v.state))
            rows += r
            sizes.append(len(r))
        return rows, sizes

    def log_probs(self, batch: tuple[list, list[int]]) -> tuple[Tensor, Tensor]:
        rows, sizes = batch
        seq = self.sequence_logp(rows).split(sizes)
        width = max(sizes)
        logp = torch.full((len(sizes), width), float("-inf"))
        legal = torch.zeros((len(sizes), width), dtype=torch.bool)
        for i, s in enumerate(seq):
            logp[i, : len(s)] = torch.log_softmax(s, 0)
            legal[i, : len(s)] = True
        return logp, legal

    def learning_rate(self, cfg) -> float:
        return cfg.lm.lr

    def frozen(self) -> "LMActor":
        frozen = LMActor(copy.deepcopy(self.lm).requires_grad_(False).eval(), self.tokenizer, self.score_batch)
        frozen.cache, frozen._ids = {}, self._ids
        return frozen

    def warm_start(self, env, train, cfg, seed: int) -> None:
        """A short SFT on the environment's reference transcripts, the loss on the LM's own tokens (the observations
        are context): the format and a prior over queries, as BRIDGE's policy is warm-started (recipes/search/bridge_trainer.py)."""
        from posttrain.recipes.search.bridge_trainer import action_mask_sft

        if cfg.lm.sft_steps:
            demos = [SimpleNamespace(prompt=p, completion=c) for p, c in (env.demonstration(q) for q in train)]
            action_mask_sft(self.lm, self.tokenizer, demos, cfg.lm.sft_steps, cfg.lm.sft_lr, cfg.lm.sft_batch_size, seed)
        self.lm.eval()

    def save(self, out: Path) -> None:
        """A `from_pretrained` directory (the LM and its tokenizer) and `actor.json` (which actor it is)."""
        from posttrain.models import save_pretrained

        save_pretrained(self.lm, self.tokenizer, out)
        (out / "actor.json").write_text(json.dumps({"actor": "lm", "score_batch": self.score_batch}) + "\n")


@actors.register("mlp")
def mlp_actor(cfg, env: RecoverableEnv, model_cfg, alphabet: str | None) -> Actor:
    """An MLP over the environment's features of each legal action (`asct.hidden_size`); softmax over the legal set."""
    return Actor(env.n_features, cfg.hidden_size)


@actors.register("lm")
def lm_actor(cfg, env: RecoverableEnv, model_cfg, alphabet: str | None) -> LMActor:
    """The language model (`model`: a tiny char-level LM from scratch) scoring each legal action's text after the
    state's text; softmax of the sequence log-probabilities over the legal set."""
    from posttrain.models import build_tiny, train_char_tokenizer

    if model_cfg is None or alphabet is None:
        raise UserError("asct.actor lm needs the model section and an environment with a text view (task search)")
    if model_cfg.path is not None:
        raise UserError(f"asct.actor lm trains a tiny char-level model from scratch: set model.path=null (got {model_cfg.path!r})")
    tokenizer = train_char_tokenizer([alphabet])
    return LMActor(build_tiny(model_cfg, tokenizer), tokenizer, cfg.lm.score_batch)
