"""AURA's chronological market sandbox (recipes/aura/market.py) as a task: a prompt is a decision (ticker, day), the
answer its realised return over the horizon, the reference completion a scripted analyst's tool-use
demonstration, and the verifier AURA's direction-magnitude score (recipes/aura/market.py; the rewards of
recipes/aura/reward.py). Its `sampler` runs the episodes (tool calls answered by the environment, masked from the
loss) in place of single-turn sampling.

The splits are chronological: train decisions end, horizon included, before the first held-out decision day,
so no held-out return is ever part of a train episode's outcome. The analyst's forecasts are right only as often
as momentum is, so a demonstration is checked by replay (every observation is what the tools return at its
decision time, `reference_verified`), not by its score. Settings: task.options.market (defaults on its options model).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator

from posttrain.config import Section
from posttrain.recipes.aura.market import (
    TICKERS, TOOLS, MarketEpisode, Sandbox, calls_of, parse_forecast, parse_prompt, prompt_of, replays, score_parts, scripted_analyst,
)
from posttrain.envs.rollout import env_sampler
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task


class MarketOptions(Section):
    tickers: int = Field(24, ge=2, le=len(TICKERS))  # stocks A.. in the seeded series (regimes: trend, mean reversion, quiet; GARCH volatility; market shocks)
    days: int = Field(260, ge=100, le=999)  # trading days in the series (decision days print as at most 3 digits)
    horizon: int = Field(5, ge=1, le=20)  # H: the forecast is the return from the decision day to H days later
    sandbox_seed: int = 0  # the series (the same market for every pipeline seed)
    heldout_share: float = Field(0.3, gt=0, lt=1)  # the last share of the decision days is held out (chronological split)
    max_calls: int = Field(8, ge=1, le=16)  # tool calls per episode; one more ends it unscored
    magnitude: Literal["buckets", "soft"] = "buckets"  # buckets: |f| and |r| in the same bucket; soft: max(0, 1 - ||f| - |r|| / tau)
    magnitude_edges: tuple[float, ...] = (1.0, 3.0, 6.0)  # bucket edges in percent: [0, e1), [e1, e2), ..., [ek, inf)
    tau: float = Field(2.0, gt=0)  # soft magnitude scale, in percent

    @field_validator("magnitude_edges")
    @classmethod
    def _edges(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or list(v) != sorted(set(v)) or v[0] <= 0:
            raise ValueError("must be positive and strictly increasing")
        return v


@tasks.register("market", options=MarketOptions)
class Market(Task):
    @cached_property
    def opts(self) -> MarketOptions:
        return self.cfg.options_for("market")

    @cached_property
    def sandbox(self) -> Sandbox:
        o = self.opts
        return Sandbox(o.sandbox_seed, o.tickers, o.days, o.horizon)

    def splits(self, seed: int) -> dict[str, list[Example]]:
        days = self.sandbox.decision_days
        cut = days.start + int(len(days) * (1 - self.opts.heldout_share))
        pools = {"train": [(i, d) for i in range(self.opts.tickers) for d in range(days.start, cut - self.opts.horizon)],
                 "heldout": [(i, d) for i in range(self.opts.tickers) for d in range(cut, days.stop)]}
        wanted = {"train": self.cfg.n_train, "heldout": self.cfg.n_heldout}
        rng = random.Random(seed)
        out = {}
        for name, pool in pools.items():
            if wanted[name] > len(pool):
                raise UserError(f"task.n_{name} = {wanted[name]} exceeds the {len(pool)} {name} decisions of the market sandbox "
                                "(grow task.options.market.tickers or days)")
            out[name] = [self.example(i, d, rng) for i, d in rng.sample(pool, wanted[name])]
        return out

    def example(self, ticker: int, day: int, rng: random.Random) -> Example:
        return Example(prompt=prompt_of(ticker, day), completion=scripted_analyst(self.sandbox, ticker, day, rng),
                       answer=f"{self.sandbox.realised_return(ticker, day):.4f}")

    def forecast(self, completion: str) -> float | None:
        return parse_forecast(completion, self.opts.max_calls)

    def parse(self, completion: str) -> str | None:
        f = self.forecast(completion)
        return None if f is None else f"{f:+.1f}"

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """AURA's R = dir * mag (reward.py), in [0, 1]."""
        d, m = self.parts(completion, example)
        return d * m if d else 0.0

    def parts(self, completion: str, example: Example) -> tuple[float, float]:
        """(dir, mag | dir) of a completion (AURA's score, market.py)."""
        o = self.opts
        return score_parts(self.forecast(completion), float(example.answer), o.magnitude, o.magnitude_edges, o.tau)

    def reference_verified(self, example: Example) -> bool:
        """A demonstration is well formed and replays: its observations are the tools' answers at its decision time."""
        ticker, day = parse_prompt(example.prompt)
        return self.format_reward(example.completion, True) == 1.0 and replays(self.sandbox, ticker, day, example.completion)

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        d, m = self.parts(completion, example)
        calls = Counter(name for name, _ in calls_of(completion))
        return {"direction": d, "direction_and_magnitude": d * m if d else 0.0, "tool_calls": float(sum(calls.values())),
                **{f"calls_{t}": float(calls[t]) for t in TOOLS}}

    def rollout_metrics(self, completions: Sequence[str]) -> dict[str, float]:
        """The share of each tool in a batch's calls (and the calls per episode), logged by the rl loop."""
        return tool_shares(completions)

    def alphabet(self) -> str:
        return TICKERS + "0123456789@>[]=;,.+-xv? " + "".join(sorted(set("".join(TOOLS))))

    def sampler(self, tokenizer):
        """Multi-turn episodes for the RL loop and the evaluation (see trainers/online_rl.rollout)."""
        return env_sampler(tokenizer, lambda prompt: MarketEpisode(self.sandbox, prompt, self.opts.max_calls))


def tool_shares(completions: Sequence[str]) -> dict[str, float]:
    """tools/share_<tool>: its calls over all known-tool calls; tools/calls_per_episode; tools/unknown_calls."""
    calls = Counter(name for c in completions for name, _ in calls_of(c))
    known = sum(calls[t] for t in TOOLS)
    out = {f"tools/share_{t}": calls[t] / known if known else 0.0 for t in TOOLS}
    out["tools/calls_per_episode"] = sum(calls.values()) / max(len(completions), 1)
    out["tools/unknown_calls"] = float(sum(calls.values()) - known)
    return out
