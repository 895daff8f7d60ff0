"""The BRIDGE loop (recipes/search/bridge_objective.py) and its comparison arms on the search task, one iteration at a time:

    rollouts y_i ~ (pi_theta, P_phi) on `prompts_per_step` questions, G episodes each; GRPO advantages A_i
    frozen        policy GRPO step only (eta_phi = 0: search-agent GRPO)
    naive         retriever REINFORCE step and policy GRPO step, both from gradients at (phi_k, theta_k)
    policy_first  policy GRPO step; then the retriever step on the same rollouts, reweighted to the new policy
                  (w_i = pi_theta_{k+1}(y_i) / pi_theta_k(y_i))
    bridge        theta_hat: one lower-level (GRPO, SGD) step from theta, its log-probs on the rollouts, then undone
                  (memory_efficient: in place, through the gradient buffers, no second policy copy; otherwise on a
                  copy); the retriever step with c_i = A_i (1 + gamma_k (1 - w_hat_i)) (+ mu L_ret); then the policy
                  step on the same rollouts reweighted to the new retriever (rho_i = P_phi_{k+1}(d_i) / P_phi_k(d_i))

`order` records, per iteration, which component stepped first (the ordering invariant's witness). The loop is
self-contained (policy, retriever, their optimisers and the prompt draw): `state_dict` / `load_state_dict` make a
run resumable, and `train_bridge` runs it under a stage's TrainLoop (trainers/loop.py: every optimiser step through
its non-finite guard, checkpoints of the policy and `parts()`, `--resume`).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
import torch
from torch import Tensor

from posttrain.recipes.search.settings import BridgeConfig
from posttrain.envs.retrievers import RetrievalPolicy
from posttrain.envs.search import exact_match, token_f1
from posttrain.models.logprobs import completion_forward
from posttrain.rollout.sampling import decode_completions
from posttrain.recipes.search.bridge_objective import bridge_coefficients, importance_weights, penalty_weight, retrieval_contrastive_loss, retriever_pg_loss
from posttrain.objectives.grpo import group_normalize
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.policy_losses import clipped_surrogate
from posttrain.tasks.base import Example
from posttrain.trainers.loop import TrainLoop

ARMS = ("frozen", "naive", "policy_first", "bridge")


BridgeSettings = BridgeConfig  # the params.yaml section `bridge` (settings.py)


@dataclass
class BridgeLoop:
    task: object  # tasks/search.py Search
    policy: torch.nn.Module
    tokenizer: object
    retrieval: RetrievalPolicy
    settings: BridgeConfig
    seed: int = 0
    iteration: int = 0
    order: list[tuple[str, ...]] = field(default_factory=list)
    loop: TrainLoop = field(default_factory=TrainLoop)  # the optimiser steps' guard (and, in a stage, its checkpoints)

    def __post_init__(self):
        s = self.settings
        self.policy_opt = torch.optim.Adam([p for p in self.policy.parameters() if p.requires_grad], lr=s.policy_lr)
        trainable = self.retrieval.retriever.trainable and s.arm != "frozen"
        self.retriever_opt = torch.optim.Adam(self.retrieval.retriever.parameters(), lr=s.retriever_lr) if trainable else None
        self.generator = torch.Generator().manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        self.loss_settings = LossSettings(clip_eps_low=s.clip_eps, clip_eps_high=s.clip_eps, loss_agg="token_mean", max_new_tokens=s.max_new_tokens)

    # -- pieces -----------------------------------------------------------------------------------------------

    def encode(self, prompts: list[str]):
        enc = self.tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
        return enc.input_ids, enc.attention_mask

    def rollout(self, examples: list[Example], greedy: bool = False, group_size: int | None = None):
        g = group_size or self.settings.group_size
        ids, mask = self.encode([e.prompt for e in examples])
        sample = self.task.sampler(self.tokenizer, self.retrieval)
        samples = sample(self.policy, ids, mask, group_size=g, max_new_tokens=self.settings.max_new_tokens, eos_id=self.tokenizer.eos_token_id,
                         pad_id=self.tokenizer.pad_token_id, greedy=greedy, generator=self.generator)
        texts = decode_completions(self.tokenizer, samples)
        expanded = [e for e in examples for _ in range(g)]
        rewards = torch.tensor([self.task.correctness_reward(t, bool(f), e) for t, f, e in zip(texts, samples.finished.tolist(), expanded)])
        return SimpleNamespace(prompt_ids=ids.repeat_interleave(g, 0), prompt_mask=mask.repeat_interleave(g, 0), samples=samples, texts=texts,
                               examples=expanded, rewards=rewards, episodes=list(self.task.last_episodes),
                               group=torch.arange(len(examples)).repeat_interleave(g))

    def token_logp(self, model, b) -> Tensor:
        s = b.samples
        return completion_forward(model, b.prompt_ids, b.prompt_mask, s.completion_ids, s.attention).logp

    def sequence_logp(self, model, b) -> Tensor:
        with torch.no_grad():
            return (self.token_logp(model, b) * b.samples.completion_mask).sum(1)

    def grpo_loss(self, model, b, adv: Tensor) -> Tensor:
        loss, _ = clipped_surrogate(self.token_logp(model, b), b.samples.logp, adv, b.samples.completion_mask.float(), self.loss_settings)
        return loss

    def policy_step(self, b, adv: Tensor) -> None:
        self.policy_opt.zero_grad()
        loss = self.grpo_loss(self.policy, b, adv)
        loss.backward()
        self.loop.optimizer_step(self.iteration + 1, loss, list(self.policy.parameters()), self.policy_opt, self.settings.max_grad_norm)
        self.order[-1] += ("policy",)

    def events(self, b) -> tuple[list, Tensor]:
        events, owner = [], []
        for i, ep in enumerate(b.episodes):
            for call in ep.calls:
                events.append(call.event)
                owner.append(i)
        return events, torch.tensor(owner, dtype=torch.long)

    def retrieval_logp(self, b) -> Tensor:
        """[B] sum over each rollout's calls of log P_phi(chosen | q) under the current retriever (with gradient)."""
        events, owner = self.events(b)
        logp = self.retrieval.log_prob(events)
        return torch.zeros(len(b.episodes), dtype=logp.dtype).index_add(0, owner, logp) if events else torch.zeros(len(b.episodes))

    def retriever_step(self, b, coeff: Tensor) -> None:
        events, owner = self.events(b)
        loss = retriever_pg_loss(self.retrieval.log_prob(events), owner, coeff.detach())
        if self.settings.mu > 0:
            loss = loss + self.settings.mu * self.contrastive(b)
        self.retriever_opt.zero_grad()
        if loss.requires_grad:  # the retriever's step is not clipped (max norm inf): only the guard
            loss.backward()
            self.loop.optimizer_step(self.iteration + 1, loss, list(self.retrieval.retriever.parameters()), self.retriever_opt, float("inf"))
        self.order[-1] += ("retriever",)

    def contrastive(self, b) -> Tensor:
        """L_ret on the calls of successful episodes (reward > 0): their returned passages are the positives."""
        calls = [c for ep, r in zip(b.episodes, b.rewards.tolist()) if r > 0 for c in ep.calls]
        if not calls:
            return torch.zeros(())
        scores = self.retrieval.retriever.scores([c.event.query for c in calls])
        logits = [row[list(c.event.candidates)] / self.retrieval.tau for row, c in zip(scores, calls)]
        positives = [torch.tensor([c.event.candidates.index(d) for d in c.event.chosen]) for c in calls]
        return retrieval_contrastive_loss(logits, positives)

    def theta_hat_logp(self, b, adv: Tensor) -> Tensor:
        """Sequence log-probs on the rollouts under theta_hat = theta - inner_lr * grad G(theta): in place through the
        gradient buffers and undone (memory_efficient), or on a copy of the policy."""
        s = self.settings
        model = self.policy if s.memory_efficient else copy.deepcopy(self.policy)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        self.grpo_loss(model, b, adv).backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.sub_(s.inner_lr * p.grad)
        logp = self.sequence_logp(model, b)
        if s.memory_efficient:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.add_(s.inner_lr * p.grad)
                    p.grad = None
        return logp

    # -- one iteration ----------------------------------------------------------------------------------------

    def step(self, examples: list[Example]) -> dict[str, float]:
        s = self.settings
        b = self.rollout(examples)
        adv = group_normalize(b.rewards, b.group)
        gamma = penalty_weight(s.gamma0, self.iteration, s.gamma_power)
        self.order.append(())
        metrics = {"reward": float(b.rewards.mean()), "gamma": gamma, "recall": self.task.recall(b.episodes),
                   "calls": sum(len(e.calls) for e in b.episodes) / len(b.episodes)}
        if s.arm == "frozen" or self.retriever_opt is None:
            self.policy_step(b, adv)
        elif s.arm == "naive":  # both gradients at (phi_k, theta_k), then both steps
            self.retriever_step(b, adv)
            self.policy_step(b, adv)
        elif s.arm == "policy_first":
            before = self.sequence_logp(self.policy, b)
            self.policy_step(b, adv)
            w = importance_weights(self.sequence_logp(self.policy, b), before, s.is_clip)
            self.retriever_step(b, w * adv)
        else:  # bridge: the leader first, at the policy's value-function gap; then the follower at the new retriever
            before_policy = self.sequence_logp(self.policy, b)
            w_hat = importance_weights(self.theta_hat_logp(b, adv), before_policy, s.is_clip)
            with torch.no_grad():
                before_retrieval = self.retrieval_logp(b)
            self.retriever_step(b, bridge_coefficients(adv, w_hat, gamma))
            with torch.no_grad():
                rho = importance_weights(self.retrieval_logp(b), before_retrieval, s.is_clip)
            metrics["w_hat_spread"] = float(w_hat.std())
            self.policy_step(b, rho * adv)
        self.iteration += 1
        return metrics

    def draw(self, train: list[Example]) -> list[Example]:
        """The iteration's questions: `prompts_per_step` of `train` without replacement (the loop's own draw)."""
        return self.rng.sample(train, min(self.settings.prompts_per_step, len(train)))

    def train(self, train: list[Example], iterations: int) -> list[dict[str, float]]:
        return [self.step(self.draw(train)) for _ in range(iterations)]

    @torch.no_grad()
    def evaluate(self, heldout: list[Example]) -> dict[str, float]:
        """Greedy policy and greedy (top-k) retrieval on held-out questions: EM, F1, gold-passage recall."""
        greedy, self.retrieval.greedy = self.retrieval.greedy, True
        try:
            b = self.rollout(heldout, greedy=True, group_size=1)
        finally:
            self.retrieval.greedy = greedy
        answers = [self.task.parse(t) for t in b.texts]
        self.last_eval_episodes = episode_rows(self.task, b.episodes, answers, b.examples)
        return {"em": sum(exact_match(a, e.answer) for a, e in zip(answers, b.examples)) / len(answers),
                "f1": sum(token_f1(a, e.answer) for a, e in zip(answers, b.examples)) / len(answers),
                "recall": self.task.recall(b.episodes)}

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "policy_opt": self.policy_opt.state_dict(),
                "retriever": self.retrieval.retriever.state_dict() if self.retrieval.retriever.trainable else None,
                "retriever_opt": self.retriever_opt.state_dict() if self.retriever_opt else None, "iteration": self.iteration,
                "generator": self.generator.get_state(), "retrieval_generator": self.retrieval.generator.get_state(),
                "rng": self.rng.getstate(), "order": list(self.order)}

    def parts(self) -> dict:
        """What a TrainLoop checkpoint saves besides the policy's weights (its `model`): optimisers, the trainable
        retriever, the rollout, retrieval and prompt-draw generators. The iteration and `order` go in its values."""
        parts = {"policy_opt": self.policy_opt, "generator": self.generator, "rng": self.rng}
        if self.retrieval.generator is not None:
            parts["retrieval_generator"] = self.retrieval.generator
        if self.retriever_opt is not None:
            parts.update(retriever=self.retrieval.retriever, retriever_opt=self.retriever_opt)
        return parts

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        if state["retriever"] is not None:
            self.retrieval.retriever.load_state_dict(state["retriever"])
        if state["retriever_opt"] is not None:
            self.retriever_opt.load_state_dict(state["retriever_opt"])
        self.iteration = state["iteration"]
        self.generator.set_state(state["generator"])
        self.retrieval.generator.set_state(state["retrieval_generator"])
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def train_bridge(bridge: BridgeLoop, train: list[Example], heldout: list[Example], on_log=None, log_every: int = 1, fresh=None
                 ) -> tuple[list[dict], dict[str, float]]:
    """`bridge.settings.iterations` iterations under `bridge.loop`, restored from its newest checkpoint on resume; a
    fresh run first calls `fresh()` (e.g. a warm start) and evaluates the starting point. Returns (history, metrics:
    held-out greedy `heldout_em`, `heldout_f1`, `heldout_recall` after training and `heldout_*_before` it, `order_ok`
    (every iteration stepped in its arm's order), `train_reward_last` (the last third's rollout reward), `nonfinite_steps`)."""
    loop, total = bridge.loop, bridge.settings.iterations
    start, saved = loop.restore(bridge.policy, bridge.parts())
    if start == 0:
        if fresh is not None:
            fresh()
        saved = {"before": bridge.evaluate(heldout)}
    history: list[dict] = saved.get("history", [])
    bridge.iteration, bridge.order = start, [tuple(o) for o in saved.get("order", [])]
    for step in range(start + 1, total + 1):
        history.append(bridge.step(bridge.draw(train)))
        if on_log and (step % log_every == 0 or step == total):
            on_log(step, history[-1])
        loop.checkpoint(step, total, bridge.policy, bridge.parts(), {"history": history, "order": [list(o) for o in bridge.order], "before": saved["before"]})
    final = bridge.evaluate(heldout)
    last = history[-max(1, len(history) // 3):]
    first = ("policy",) if bridge.retriever_opt is None else ("policy", "retriever") if bridge.settings.arm == "policy_first" else ("retriever", "policy")
    metrics = {**{f"heldout_{k}": v for k, v in final.items()}, **{f"heldout_{k}_before": v for k, v in saved["before"].items()},
               "train_reward_last": sum(h["reward"] for h in last) / len(last), "order_ok": float(all(o == first for o in bridge.order)), **loop.metrics()}
    return history, metrics


def episode_rows(task, episodes, answers, examples) -> list[dict[str, str]]:
    """The example-episodes table: per episode its question, search queries, retrieved passages, answer and gold."""
    passages = task.corpus.passages
    return [{"question": ep.prompt, "queries": " || ".join(c.query for c in ep.calls),
             "retrieved": " || ".join(" | ".join(passages[i] for i in c.passages) for c in ep.calls),
             "answer": "" if a is None else a, "gold": e.answer} for ep, a, e in zip(episodes, answers, examples)]


def action_mask_sft(policy, tokenizer, examples: list[Example], steps: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """A warm start on the reference transcripts, the loss on the policy's own tokens only (the `<result>` blocks,
    the environment's words, are context): so the policy writes searches and answers before RL."""
    from posttrain.envs.search import RESULT_CLOSE, RESULT_OPEN

    rng = random.Random(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    rows = []
    for e in examples:
        ids, labels = tokenizer(e.prompt, add_special_tokens=False).input_ids, []
        labels = [-100] * len(ids)
        text, inside = e.completion, False
        for i, ch in enumerate(text):
            if text.startswith(RESULT_OPEN, i):
                inside = True
            token = tokenizer.convert_tokens_to_ids(ch)
            ids.append(token)
            labels.append(-100 if inside else token)
            if inside and text[: i + 1].endswith(RESULT_CLOSE):
                inside = False
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
        rows.append((ids, labels))
    losses = []
    policy.train()
    for _ in range(steps):
        pick = [rows[rng.randrange(len(rows))] for _ in range(batch_size)]
        width = max(len(r[0]) for r in pick)
        ids = torch.full((len(pick), width), tokenizer.pad_token_id)
        labels = torch.full((len(pick), width), -100)
        attn = torch.zeros((len(pick), width), dtype=torch.long)
        for r, (i, l) in enumerate(pick):  # right padding: positions start at 0 for every row
            ids[r, : len(i)], labels[r, : len(l)], attn[r, : len(i)] = torch.tensor(i), torch.tensor(l), 1
        loss = policy(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
