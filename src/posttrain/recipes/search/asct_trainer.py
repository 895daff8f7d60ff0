"""ASCT training (Attentive Search over Counterfactual Trees, 2026; specs/seed_methods.md §24) and its two baselines,
in any recoverable environment (recipes/search/recoverable.py), e.g. the search environment (recipes/search/search_tree.py).

The actor (`asct.actor`, recipes/search/asct_actors.py) is the language model by default: its probability of a legal
action is the LM's sequence probability of the action's text (`<search>q</search>`, `<answer>x</answer>`) after the
state's text (the question, earlier calls and their observations), normalised over the legal set; or an MLP over
hand-made features of each legal action. The actor plays episodes to a terminal utility U (answer F1 minus a cost
per search call). Every iteration:

1. rollout: `asct.episodes` training episodes by the actor; per visited state the action taken, its
   log-probability and the whole action distribution pi_0 (the actor as it is now, frozen for this iteration);
2. credit, by the arm `asct.credit` (registry `credits`):
   asct        at each visited state the auxiliary tree (rollout/tree.py, `asct.tree_policy`) spends `asct.n_sim`
               simulations on the legal actions, each continued by the frozen actor pi_0 to termination; the table
               Q_hat centred by pi_0 (recipes/search/asct_objective.py) is the credit of the actor's action, mixed with the
               trajectory credit by `asct.lambda_mix`
   trajectory  trajectory-return PPO: U - mean U of the iteration's episodes on every action of the episode
   mc_value    a Monte-Carlo value baseline (VinePPO, Kazemnejad et al. 2024, arXiv 2410.01679, eq. 5):
               V_hat(s_t) = the mean utility of `asct.mc_rollouts` pi_0 rollouts from s_t (or as many as fit in
               `asct.mc_token_budget` auxiliary tokens, to match another arm's spend), V_hat(s_T) = U, and
               A_t = V_hat(s_{t+1}) - V_hat(s_t)
3. PPO: `asct.epochs` passes of the clipped surrogate (objectives/policy_losses.py `clip`, eps `asct.clip_eps`) over
   the visited states, each action's log-probability under the live actor against its rollout-time one. For the LM
   this is one ratio per action, pi(a_t|s_t) / pi_0(a_t|s_t) with pi the legal-set-normalised sequence probability:
   the credit is defined on that policy (centred under it), and the gradient reaches every token of a_t's text (and,
   through the normaliser, the competing actions' tokens).

Deployment uses the actor alone: held-out figures are greedy actor episodes, no tree. Auxiliary tokens (everything
the tree's or the value baseline's simulations wrote, and for the LM actor every legal action's tokens it scored to
choose) are counted per iteration, so arms compare at matched tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from posttrain.recipes.search.recoverable import RecoverableEnv
from posttrain.recipes.search.asct_objective import local_credit, mixed_credit
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.policy_losses import clipped_surrogate
from posttrain.registry import Registry
from posttrain.rollout.tree import Simulation, search
from posttrain.recipes.search.asct_actors import Actor, actors
from posttrain.trainers.loop import TrainLoop

credits: Registry = Registry("asct credit")


@dataclass
class Visit:
    state: Any
    taken: int  # index into env.legal_actions(state)
    logp: float  # log pi_0(a_t | s_t)
    pi0: Tensor  # [A] the frozen actor's probabilities
    tokens: int  # tokens of the transition (written, and for the LM also scored)


@dataclass
class Episode:
    example: Any
    visits: list[Visit] = field(default_factory=list)
    final: Any = None
    utility: float = 0.0
    tokens: int = 0


@torch.no_grad()
def act(actor: Actor, env: RecoverableEnv, state, generator: torch.Generator | None, greedy: bool) -> tuple[int, Tensor, list]:
    actions = env.legal_actions(state)
    probs = actor.distribution(env, state, actions)
    index = int(probs.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=generator))
    return index, probs, actions


def play(actor: Actor, env: RecoverableEnv, example, generator: torch.Generator | None, greedy: bool = False,
         max_steps: int = 16, state=None) -> Episode:
    """One episode by `actor` from `example`'s start (or from `state`, a recovered prefix)."""
    state = env.start(example) if state is None else state
    episode = Episode(example)
    for _ in range(max_steps):
        if env.done(state):
            break
        index, probs, actions = act(actor, env, state, generator, greedy)
        tokens = env.tokens(state, actions[index]) + actor.extra_tokens(env, state, actions, index)
        episode.visits.append(Visit(state, index, float(probs[index].log()), probs, tokens))
        episode.tokens += tokens
        state = env.step(state, actions[index])
    episode.final, episode.utility = state, env.utility(state)  # an unfinished episode scores as unanswered
    return episode


def simulate(frozen: Actor, env: RecoverableEnv, state, generator: torch.Generator, max_steps: int, first=None) -> Simulation:
    """A simulation from a recovered `state`: the action `first` (if given), then the frozen actor to termination."""
    tokens, calls = 0, env.calls(state)
    if first is not None:  # the tree chose it: the actor scored no alternatives
        tokens += env.tokens(state, first)
        state = env.step(state, first)
    episode = play(frozen, env, None, generator, max_steps=max_steps, state=state)
    return Simulation(episode.utility, tokens + episode.tokens, env.calls(episode.final) - calls)


def trajectory_advantages(episodes: Sequence[Episode]) -> list[Tensor]:
    utilities = torch.tensor([e.utility for e in episodes], dtype=torch.float64)
    baseline = utilities.mean()
    return [torch.full((len(e.visits),), float(e.utility - baseline), dtype=torch.float64) for e in episodes]


@credits.register("trajectory")
def trajectory_credit(episodes: Sequence[Episode], frozen: Actor, env: RecoverableEnv, cfg, generator) -> tuple[list[Tensor], dict]:
    """trajectory-return PPO: U - mean U of the iteration's episodes on every action of the episode."""
    return trajectory_advantages(episodes), {"aux_tokens": 0.0, "visits": float(sum(len(e.visits) for e in episodes))}


@credits.register("asct")
def asct_credit(episodes: Sequence[Episode], frozen: Actor, env: RecoverableEnv, cfg, generator) -> tuple[list[Tensor], dict]:
    """The tree's centred Q_hat at every visited state (mixed with the trajectory credit by lambda_mix)."""
    out, tokens, spread, unevaluated = [], 0, [], 0
    for episode, traj in zip(episodes, trajectory_advantages(episodes)):
        rows = []
        for v in episode.visits:
            actions = env.legal_actions(v.state)
            tree = search(len(actions), lambda a: simulate(frozen, env, v.state, generator, cfg.max_steps, actions[a]), cfg.n_sim,  # noqa: B023  (search calls it now, inside this iteration)
                          cfg.tree_policy, cfg.uct_c, cfg.cost_weight, first=v.taken, generator=generator)
            tokens += tree.tokens
            credit = local_credit(tree.q[None], v.pi0[None].double(), tree.evaluated[None], torch.tensor([v.taken]))
            rows.append(float(credit))
            unevaluated += int(not tree.evaluated[v.taken])
            q = tree.q[tree.evaluated]
            spread.append(float(q.max() - q.min()) if len(q) else 0.0)
        out.append(mixed_credit(torch.tensor(rows, dtype=torch.float64), traj, cfg.lambda_mix))
    return out, {"aux_tokens": float(tokens), "visits": float(sum(len(e.visits) for e in episodes)), "q_spread": sum(spread) / max(len(spread), 1), "taken_unevaluated": float(unevaluated)}


def value_rollouts(frozen: Actor, env: RecoverableEnv, state, generator, cfg) -> list[Simulation]:
    """`mc_rollouts` frozen-actor rollouts from `state`; with `mc_token_budget` > 0, rollouts until their tokens reach
    it (at least one): the auxiliary tokens per visited state an arm is matched at."""
    if not cfg.mc_token_budget:
        return [simulate(frozen, env, state, generator, cfg.max_steps) for _ in range(cfg.mc_rollouts)]
    sims: list[Simulation] = []
    while not sims or sum(s.tokens for s in sims) < cfg.mc_token_budget:
        sims.append(simulate(frozen, env, state, generator, cfg.max_steps))
    return sims


@credits.register("mc_value")
def mc_value_credit(episodes: Sequence[Episode], frozen: Actor, env: RecoverableEnv, cfg, generator) -> tuple[list[Tensor], dict]:
    """VinePPO's Monte-Carlo values: A_t = V_hat(s_{t+1}) - V_hat(s_t), V_hat(s_T) = U."""
    out, tokens = [], 0
    for episode in episodes:
        values = []
        for v in episode.visits:
            sims = value_rollouts(frozen, env, v.state, generator, cfg)
            tokens += sum(s.tokens for s in sims)
            values.append(sum(s.utility for s in sims) / len(sims))
        values.append(episode.utility)
        v = torch.tensor(values, dtype=torch.float64)
        out.append(v[1:] - v[:-1])
    return out, {"aux_tokens": float(tokens), "visits": float(sum(len(e.visits) for e in episodes))}


class ASCTTrainer:
    def __init__(self, cfg, env: RecoverableEnv, train: Sequence, seed: int, model_cfg=None):
        torch.manual_seed(seed)
        self.cfg, self.env, self.train = cfg, env, list(train)
        self.actor = actors.get(cfg.actor)(cfg, env, model_cfg, env.alphabet())
        self.optimizer = torch.optim.Adam(self.actor.parameters(), lr=self.actor.learning_rate(cfg))
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)
        self.loss_settings = LossSettings(clip_eps_low=cfg.clip_eps, clip_eps_high=cfg.clip_eps, loss_agg="token_mean")

    def parts(self) -> dict:
        return {"optimizer": self.optimizer, "generator": self.generator}

    def collect(self) -> tuple[list[Episode], Actor]:
        """The iteration's episodes and the frozen actor pi_0 that sampled them."""
        frozen = self.actor.frozen()
        index = torch.randint(len(self.train), (self.cfg.episodes,), generator=self.generator)
        return [play(frozen, self.env, self.train[int(i)], self.generator, max_steps=self.cfg.max_steps) for i in index], frozen

    def credit(self, episodes: Sequence[Episode], frozen: Actor) -> tuple[Tensor, dict]:
        per_episode, metrics = credits.get(self.cfg.credit)(episodes, frozen, self.env, self.cfg, self.generator)
        return torch.cat(per_episode).float(), metrics

    def update(self, visits: Sequence[Visit], advantages: Tensor, step: int, loop: TrainLoop) -> dict[str, float]:
        batch = self.actor.prepare(self.env, visits)
        taken, old_logp = torch.tensor([v.taken for v in visits]), torch.tensor([v.logp for v in visits])
        sums, n = {}, 0
        for _ in range(self.cfg.epochs):
            logp_all, legal = self.actor.log_probs(batch)
            logp = logp_all.gather(1, taken[:, None])
            loss, m = clipped_surrogate(logp, old_logp[:, None], advantages, torch.ones_like(logp), self.loss_settings)
            entropy = -(logp_all.exp() * logp_all.masked_fill(~legal, 0.0)).sum(-1).mean()
            loss = loss - self.cfg.entropy_coef * entropy
            loss.backward()
            m.update(loss=float(loss.detach()), entropy=float(entropy.detach()),
                     grad_norm=loop.optimizer_step(step, loss, list(self.actor.parameters()), self.optimizer, self.cfg.max_grad_norm))
            sums = {k: sums.get(k, 0.0) + v for k, v in m.items()}
            n += 1
        return {k: v / n for k, v in sums.items()}

    def iteration(self, step: int, loop: TrainLoop) -> dict[str, float]:
        episodes, frozen = self.collect()
        advantages, metrics = self.credit(episodes, frozen)
        visits = [v for e in episodes for v in e.visits]
        metrics.update(self.update(visits, advantages, step, loop))
        metrics.update(train_utility=sum(e.utility for e in episodes) / len(episodes),
                       advantage_abs=float(advantages.abs().mean()), steps_per_episode=len(visits) / len(episodes),
                       informative=float((advantages.abs() > 1e-9).float().mean()))
        return metrics

    @torch.no_grad()
    def evaluate(self, examples: Sequence) -> tuple[dict[str, float], list[Episode]]:
        """Greedy actor episodes (deployment: no tree) and the environment's figures of each; with `eval_samples` k > 0,
        also k sampled episodes per question (`sampled_*`, from a generator of their own seeded by the run's seed): the
        policy's distribution, which two runs can move differently while their argmax actions agree."""
        episodes = [play(self.actor, self.env, e, None, greedy=True, max_steps=self.cfg.max_steps) for e in examples]
        out = self.figures(episodes)
        if self.cfg.eval_samples:
            draw = torch.Generator().manual_seed(self.seed + 7919)
            sampled = [play(self.actor, self.env, e, draw, max_steps=self.cfg.max_steps) for e in examples for _ in range(self.cfg.eval_samples)]
            out.update({f"sampled_{k}": v for k, v in self.figures(sampled).items()})
        return out, episodes

    def figures(self, episodes: Sequence[Episode]) -> dict[str, float]:
        rows = [self.env.figures(e.final) if hasattr(self.env, "figures") else {} for e in episodes]
        out = {"utility": sum(e.utility for e in episodes) / len(episodes), "tokens": sum(e.tokens for e in episodes) / len(episodes)}
        for key in rows[0] if rows else []:
            out[key] = sum(r[key] for r in rows) / len(rows)
        return out


def train_asct(cfg, env: RecoverableEnv, train: Sequence, heldout: Sequence, seed: int, loop: TrainLoop | None = None,
               on_log: Callable[[int, dict], None] | None = None, model_cfg=None, initial: dict | None = None) -> tuple[ASCTTrainer, list[dict], dict[str, float], list[Episode]]:
    """(the trainer, per-iteration history, final figures: held-out greedy `heldout_*` and the total `aux_tokens`, the
    held-out episodes) under `cfg` (the asct section; `model_cfg`: the model section, the LM actor's shape). A fresh
    run warm-starts the actor, or loads `initial` (the state_dict of an actor warm-started the same way: arms that share
    a start compute it once)."""
    loop = loop or TrainLoop()
    trainer = ASCTTrainer(cfg, env, train, seed, model_cfg)
    start, saved = loop.restore(trainer.actor, trainer.parts())
    if start == 0 and initial is not None:
        trainer.actor.load_state_dict(initial)
    elif start == 0:  # a fresh run: the LM actor's warm start (a resumed one restores the weights it reached)
        trainer.actor.warm_start(env, train, cfg, seed)
    history: list[dict] = saved.get("history", [])
    for step in range(start + 1, cfg.iterations + 1):
        history.append(trainer.iteration(step, loop))
        if on_log and (step % cfg.log_every == 0 or step == cfg.iterations):
            on_log(step, history[-1])
        loop.checkpoint(step, cfg.iterations, trainer.actor, trainer.parts(), {"history": history})
    final, episodes = trainer.evaluate(heldout)
    metrics = {**{f"heldout_{k}": v for k, v in final.items()}, "aux_tokens": sum(h["aux_tokens"] for h in history), **loop.metrics()}
    return trainer, history, metrics, episodes
