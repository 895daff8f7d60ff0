"""A chronological market sandbox (AURA, 2026; spec §12): seeded price series, tools that see only the past,
and episodes that end with a numeric return forecast.

The series. One market index and `tickers` stocks over `days` trading days, drawn from one seed:

    market    m_t = sigma_t z_t (+ a shock J_t on a few days),  sigma_t^2 = w + a m_{t-1}^2 + b sigma_{t-1}^2   (GARCH(1,1):
              volatility clusters); a shock is a market-wide jump of 4-8% (mostly down) that every stock takes with its beta
    stock i   log P_{i,t} = log P_{i,t-1} + beta_i m_t + mu_{i,t} + e_{i,t},   e_{i,t} ~ N(0, s_{i,t}^2), its own GARCH clusters
    regimes   each stock's days fall in segments of 30-60 days, each a regime: `trend` (60%: mu = a persistent drift of
              +-0.4-0.9% a day), `revert` (20%: mu = -0.15 (log P_{t-1} - anchor), mean reversion to the segment's
              start) or `quiet` (20%: mu = 0)
    volume    V_{i,t} = base_i exp(0.3 min(|r_{i,t}| / s_{i,t}, 5) + noise): heavier on large moves and on shock days

A decision is (ticker, day d); its realised return is r = P_{d+H} / P_d - 1 over the horizon H (in percent).

The tools (`call_tool`) read a `History`: copies of the series cut at the decision day, so no tool can read a
later value; every result carries `as_of`, the last day it read, and the tool layer refuses a result dated after
the decision (tests/recipes/aura/test_market.py perturbs every later value and checks that no tool output changes):

    [price N]    "=<last close>,<N-day return %>;"          e.g. [price 5]=104.2,+3.1;
    [volume N]   "=x<N-day mean volume / 60-day mean>;"    e.g. [volume 5]=x1.4;
    [rel N]      "=<N-day return minus the market's, %>;"  e.g. [rel 5]=+1.2;
    [market N]   "=<market N-day return %>,v<market daily volatility over N days, %>;"   e.g. [market 5]=-2.0,v1.3;

with N in {5, 10, 20}. An episode's transcript is the policy's calls, each followed by the environment's answer
(observation tokens: masked from the RL loss), then the forecast: a signed percent with one decimal, e.g. `+2.5`,
ended by EOS. `scripted_analyst` writes the demonstrations SFT learns from: it calls the tools and forecasts the
return its last call reported (momentum over the horizon), so the demonstrations carry real, imperfect signal.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from posttrain.envs.base import Env, Step

TICKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOOLS = ("price", "volume", "rel", "market")
WINDOWS = (5, 10, 20)
VOLUME_BASELINE = 60  # days in the volume tool's baseline mean; the first decision day is at least this
CALL = re.compile(r"\[([a-z]+) (\d+)\]")
OBSERVATION = re.compile(r"=[^;\[\]]*;")  # what the environment writes after a call
FORECAST = re.compile(r"[+-]\d{1,2}\.\d")
PROMPT = re.compile(r"([A-Z])@(\d+)>")


class LookAhead(RuntimeError):
    """A tool produced a value dated after the decision time (a bug in the tool layer, never a user error)."""


@dataclass(frozen=True)
class History:
    """The series up to and including `day`: everything a tool may read at that decision time."""

    day: int
    close: np.ndarray  # [tickers, day + 1]
    volume: np.ndarray  # [tickers, day + 1]
    market: np.ndarray  # [day + 1] the index level

    def __post_init__(self):
        if not (self.close.shape[1] == self.volume.shape[1] == self.market.shape[0] == self.day + 1):
            raise LookAhead(f"a history of day {self.day} holds {self.close.shape[1]} days")


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the environment writes back, between "=" and ";"
    as_of: int  # the last day whose data the result read


class Sandbox:
    """The seeded series (see the module docstring). `history(d)` is the only door the tools go through."""

    def __init__(self, seed: int, tickers: int, days: int, horizon: int):
        self.seed, self.n_tickers, self.days, self.horizon = seed, tickers, days, horizon
        rng = np.random.default_rng(seed)
        market = np.zeros(days)
        var = 0.6e-2 ** 2
        self.shock_days: list[int] = []
        for t in range(1, days):
            var = 0.05 * 0.6e-2 ** 2 + 0.12 * market[t - 1] ** 2 + 0.83 * var
            market[t] = math.sqrt(var) * rng.standard_normal()
            if rng.random() < 0.02:
                market[t] += (-1 if rng.random() < 0.7 else 1) * rng.uniform(0.04, 0.08)
                self.shock_days.append(t)
        beta = rng.uniform(0.6, 1.4, tickers)
        idio = rng.uniform(0.5e-2, 1.0e-2, tickers)
        log_p = np.zeros((tickers, days))
        log_vol = np.zeros((tickers, days))
        regime = np.zeros((tickers, days), dtype=np.int8)  # 0 quiet, 1 trend, 2 revert (diagnostics; no tool reads it)
        for i in range(tickers):
            var_i, shock, anchor, drift, kind = idio[i] ** 2, 0.0, 0.0, 0.0, 0
            segment_end = 0
            base = rng.uniform(0.0, 1.0)
            for t in range(1, days):
                if t >= segment_end:
                    segment_end = t + int(rng.integers(30, 61))
                    kind = int(rng.choice(3, p=[0.2, 0.6, 0.2]))
                    drift = (1 if rng.random() < 0.5 else -1) * rng.uniform(0.004, 0.009)
                    anchor = log_p[i, t - 1]
                var_i = 0.05 * idio[i] ** 2 + 0.10 * shock ** 2 + 0.85 * var_i
                mu = drift if kind == 1 else -0.15 * (log_p[i, t - 1] - anchor) if kind == 2 else 0.0
                shock = math.sqrt(var_i) * rng.standard_normal()
                step = beta[i] * market[t] + mu + shock
                log_p[i, t] = log_p[i, t - 1] + step
                log_vol[i, t] = base + 0.3 * min(abs(step) / math.sqrt(var_i), 5.0) + 0.2 * rng.standard_normal()
                regime[i, t] = kind
        self.close = 100.0 * np.exp(log_p)
        self.volume = 1000.0 * np.exp(log_vol)
        self.market = 100.0 * np.exp(np.cumsum(market))
        self.regime = regime

    @property
    def decision_days(self) -> range:
        """Days a forecast can be asked at: enough past for every tool, the horizon inside the series."""
        return range(VOLUME_BASELINE, self.days - self.horizon)

    def history(self, day: int) -> History:
        if not 0 <= day < self.days:
            raise ValueError(f"day {day} is outside the series (0..{self.days - 1})")
        return History(day, self.close[:, : day + 1].copy(), self.volume[:, : day + 1].copy(), self.market[: day + 1].copy())

    def realised_return(self, ticker: int, day: int) -> float:
        """r = P_{d+H} / P_d - 1, in percent: what the forecast is scored against (never shown to a tool)."""
        return 100.0 * (self.close[ticker, day + self.horizon] / self.close[ticker, day] - 1.0)


def _pct(x: float) -> str:
    return f"{max(min(x, 99.9), -99.9):+.1f}"


def _ret(series: np.ndarray, n: int) -> float:
    return 100.0 * (series[-1] / series[-1 - n] - 1.0)


def _tool_price(h: History, i: int, n: int) -> ToolResult:
    return ToolResult(f"{h.close[i, -1]:.1f},{_pct(_ret(h.close[i], n))}", h.day)


def _tool_volume(h: History, i: int, n: int) -> ToolResult:
    ratio = h.volume[i, -n:].mean() / h.volume[i, -VOLUME_BASELINE:].mean()
    return ToolResult(f"x{min(ratio, 9.9):.1f}", h.day)


def _tool_rel(h: History, i: int, n: int) -> ToolResult:
    return ToolResult(_pct(_ret(h.close[i], n) - _ret(h.market, n)), h.day)


def _tool_market(h: History, i: int, n: int) -> ToolResult:
    daily = np.diff(np.log(h.market[-n - 1 :]))
    return ToolResult(f"{_pct(_ret(h.market, n))},v{min(100.0 * daily.std(ddof=1), 9.9):.1f}", h.day)


_TOOL_FNS = {"price": _tool_price, "volume": _tool_volume, "rel": _tool_rel, "market": _tool_market}


def call_tool(history: History, ticker: int, name: str, window: int, decision_day: int) -> ToolResult | None:
    """The tool `name` over the last `window` days of `history`; None for an unknown tool or window. A result
    dated after `decision_day` raises `LookAhead` (the tools read only `history`, cut at that day)."""
    if name not in _TOOL_FNS or window not in WINDOWS or history.day != decision_day:
        return None
    result = _TOOL_FNS[name](history, ticker, window)
    if result.as_of > decision_day:
        raise LookAhead(f"tool {name} returned data of day {result.as_of} at decision day {decision_day}")
    return result


def parse_prompt(prompt: str) -> tuple[int, int]:
    """(ticker index, decision day) of a prompt `K@132>`."""
    match = PROMPT.search(prompt)
    if match is None:
        raise ValueError(f"not a market prompt: {prompt!r}")
    return TICKERS.index(match.group(1)), int(match.group(2))


def prompt_of(ticker: int, day: int) -> str:
    return f"{TICKERS[ticker]}@{day}>"


def observation(result: ToolResult | None) -> str:
    return "=" + (result.text if result is not None else "?") + ";"


def actions_of(completion: str) -> str:
    """The policy's own text of a transcript: observations removed (what a decoded rollout holds)."""
    return OBSERVATION.sub("", completion)


def calls_of(completion: str) -> list[tuple[str, int]]:
    return [(name, int(n)) for name, n in CALL.findall(actions_of(completion))]


def parse_forecast(completion: str, max_calls: int) -> float | None:
    """The forecast (percent) of a transcript that is only tool calls (at most `max_calls`) then one forecast; else None."""
    actions = actions_of(completion)
    calls = CALL.findall(actions)
    rest = CALL.sub("", actions)
    if len(calls) > max_calls or not FORECAST.fullmatch(rest) or not actions.endswith(rest):
        return None
    return float(rest)


class MarketEpisode(Env):
    """One decision: the prompt names ticker and day; every `[tool N]` the policy closes is answered from the
    history cut at that day; after `max_calls` calls the next call ends the episode (scored 0)."""

    def __init__(self, sandbox: Sandbox, prompt: str, max_calls: int):
        self.sandbox, self.prompt, self.max_calls = sandbox, prompt, max_calls
        self.ticker, self.day = parse_prompt(prompt)
        self.text, self.calls = "", 0

    @cached_property
    def past(self) -> History:
        return self.sandbox.history(self.day)

    def reset(self) -> str:
        self.text, self.calls = "", 0
        return self.prompt

    def step(self, action: str) -> Step:
        self.text += action
        if not self.text.endswith("]"):
            return Step("", 0.0, False)
        match = re.search(r"\[([a-z]+) (\d+)\]$", self.text)
        self.calls += 1
        if self.calls > self.max_calls:
            return Step("", 0.0, True)
        result = call_tool(self.past, self.ticker, match.group(1), int(match.group(2)), self.day) if match else None
        return Step(observation(result), 0.0, False)


# -- AURA's direction-magnitude score (AURA 2026; the formula and its invariant: reward.py, which registers it) --

def sign(x: float) -> int:
    return (x > 0) - (x < 0)


def bucket(x: float, edges: Sequence[float]) -> int:
    return sum(abs(x) >= e for e in edges)


def direction(forecast: float | None, realised: float) -> float:
    return float(forecast is not None and sign(forecast) == sign(realised) != 0)


def magnitude(forecast: float, realised: float, mode: str, edges: Sequence[float], tau: float) -> float:
    if mode == "buckets":
        return float(bucket(forecast, edges) == bucket(realised, edges))
    return max(0.0, 1.0 - abs(abs(forecast) - abs(realised)) / tau)


def score_parts(forecast: float | None, realised: float, mode: str = "buckets", edges: Sequence[float] = (1.0, 3.0, 6.0),
                tau: float = 2.0) -> tuple[float, float]:
    """(dir, mag | dir): mag is NaN where the direction is wrong or the forecast unparseable (undefined there)."""
    d = direction(forecast, realised)
    return d, magnitude(forecast, realised, mode, edges, tau) if d else math.nan


def score(forecast: float | None, realised: float, mode: str = "buckets", edges: Sequence[float] = (1.0, 3.0, 6.0), tau: float = 2.0) -> float:
    """R = dir * mag in [0, 1]; 0 for an unparseable forecast and for a wrong direction."""
    d, m = score_parts(forecast, realised, mode, edges, tau)
    return d * m if d else 0.0


# the analyst's tool plans: each ends with a call whose return figure (over the horizon) is the forecast
ANALYST_PLANS = (("rel 5",), ("price 5",), ("market 5", "rel 5"), ("volume 5", "price 5"), ("price 20", "rel 5"))


def scripted_analyst(sandbox: Sandbox, ticker: int, day: int, rng: random.Random) -> str:
    """A demonstration transcript: a random plan of tool calls, each answered by the tool, then the forecast the
    last call supports (the stock's own or market-relative momentum over the horizon)."""
    past = sandbox.history(day)
    out = ""
    for call in ANALYST_PLANS[rng.randrange(len(ANALYST_PLANS))]:
        name, n = call.split()
        result = call_tool(past, ticker, name, int(n), day)
        out += f"[{call}]" + observation(result)
    figure = float(result.text.split(",")[-1])  # price: the N-day return after the close; rel: the one figure
    return out + _pct(max(min(figure, 9.9), -9.9))


def replays(sandbox: Sandbox, ticker: int, day: int, completion: str) -> bool:
    """True when every observation in a transcript is what the tool returns at the decision time."""
    expected, past = "", sandbox.history(day)
    for piece in re.split(r"(\[[a-z]+ \d+\]=[^;]*;)", completion):
        call = re.fullmatch(r"\[([a-z]+) (\d+)\](=[^;]*;)", piece)
        if call:
            expected += f"[{call.group(1)} {call.group(2)}]" + observation(call_tool(past, ticker, call.group(1), int(call.group(2)), day))
        else:
            expected += piece
    return expected == completion
