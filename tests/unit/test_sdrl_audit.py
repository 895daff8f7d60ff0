"""SDRL and selective control under partial auditing: every listed invariant on
hand-made tensors and strings, plus their options."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from posttrain import config, resolve
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix, rewards
from posttrain.rewards.audit_correction import AuditOptions, corrected_reward, draw_audits, imperfect_verifier
from posttrain.rewards.sdrl import SDRLOptions, diversity_bonuses, groups_of, sdrl_reward, similarity, strategy_of
from posttrain.tasks.base import Example, Task
from helpers import repo_params

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
RL = resolve.load(PARAMS).rl


def rl(**options):
    return resolve.updated(RL, "rl", options=options)


class Echo(Task):
    """Answers are any text; correct when equal to the example's answer; parsable unless it contains '?'."""

    def splits(self, seed):
        return {"train": [], "heldout": []}

    def parse(self, completion):
        return None if "?" in completion else completion

    def alphabet(self):
        return ""


TASK = Echo(None)
SDRL = RL.options_for("sdrl")

# one group of six: three correct programs (two solver, one heuristic), one correct "other", two wrong
CODE = [
    "import pulp\nm = pulp.LpProblem()\nm.solve()",
    "import pulp\nprob = pulp.LpProblem('x')\nprob.solve()",
    "x = greedy(items)\nreturn x",
    "answer = 42",
    "import ortools  # wrong",
    "greedy ?",
]
CORRECT = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])


def bonuses(correct=CORRECT, texts=CODE, group=None, opts=SDRL):
    group = torch.zeros(len(texts), dtype=torch.long) if group is None else group
    return diversity_bonuses(correct > 0, [strategy_of(t, opts) for t in texts], texts, group)


# ---------------------------------------------------------------- SDRL


def test_sdrl_strategy_labels_and_similarity():
    assert [strategy_of(t, SDRL) for t in CODE] == ["solver", "solver", "heuristic", "other", "solver", "heuristic"]
    assert strategy_of("import gurobipy; greedy warm start", SDRL) == "solver"  # the first matching label wins
    assert similarity("a = 1", "a = 1") == 1.0 and similarity("a b", "c d") == 0.0
    assert 0.0 < similarity(CODE[0], CODE[1]) < 1.0


def test_sdrl_gate_no_bonus_without_correctness():  # invariant 1
    d_b, d_w = bonuses()
    assert torch.equal(d_b[CORRECT == 0], torch.zeros(2)) and torch.equal(d_w[CORRECT == 0], torch.zeros(2))
    reward = sdrl_reward(CORRECT, d_b, d_w, SDRL)
    assert torch.equal(reward[CORRECT == 0], torch.zeros(2))
    assert torch.equal(sdrl_reward(torch.zeros(6), torch.ones(6), torch.ones(6), SDRL), torch.zeros(6))


def test_sdrl_bonuses_are_bounded():  # invariant 2
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        correct = (torch.rand(6, generator=gen) < 0.7).float()
        d_b, d_w = bonuses(correct)
        assert ((d_b >= 0) & (d_b <= 1) & (d_w >= 0) & (d_w <= 1)).all()
        assert (sdrl_reward(correct, d_b, d_w, SDRL) <= 1 + SDRL.beta_b + SDRL.beta_w + 1e-7).all()
    d_b, d_w = bonuses()  # hand values: C = {0, 1, 2, 3}, n_solver = 2, n_heuristic = n_other = 1
    assert d_b[:4].tolist() == pytest.approx([0.5, 0.5, 0.75, 0.75])
    assert float(d_w[0]) == pytest.approx(1 - similarity(CODE[0], CODE[1])) and float(d_w[0]) == float(d_w[1])
    assert d_w[2:4].tolist() == [0.0, 0.0]  # alone in their strategy


def test_sdrl_one_strategy_means_no_between_bonus():  # invariant 3
    texts = ["import pulp\na", "import pulp\nb b", "import pulp\nc", "x ?"]
    d_b, d_w = bonuses(torch.tensor([1.0, 1.0, 1.0, 0.0]), texts)
    assert torch.equal(d_b, torch.zeros(4)) and (d_w[:3] > 0).all()


def test_sdrl_is_permutation_invariant_and_a_lone_strategy_gets_the_largest_between_bonus():  # invariant 4
    d_b, d_w = bonuses()
    for perm in itertools.islice(itertools.permutations(range(6)), 0, 720, 37):
        p = list(perm)
        pb, pw = bonuses(CORRECT[p], [CODE[i] for i in p])
        assert torch.allclose(pb, d_b[p]) and torch.allclose(pw, d_w[p])
    lone = [2, 3]  # heuristic and other are each used by one correct rollout
    assert float(d_b[lone].min()) == float(d_b[CORRECT > 0].max()) > float(d_b[:2].max())


def test_sdrl_groups_are_separate_and_the_registered_reward_scores_end_to_end():
    a, b = Example("p", "", "ok"), Example("p", "", "ok")  # same text, distinct prompts of the batch
    examples = [a, a, a, b, b, b]
    assert groups_of(examples).tolist() == [0, 0, 0, 1, 1, 1]
    texts = ["ok", "ok", "no", "ok", "no", "no"]
    got = rewards.get("sdrl")(TASK, examples, texts, [True] * 6, rl=rl())
    assert got.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # identical correct answers: no diversity
    matrix, names, _ = reward_matrix((config.RewardSpec(name="sdrl"),), TASK, examples, texts, [True] * 6, rl=rl(), lengths=None)
    assert names == ("sdrl",) and torch.equal(matrix[:, 0], got)


# ---------------------------------------------------------------- audit correction

V = torch.tensor([1.0, 1.0, 0.0, 0.0])  # correct-accepted, accepted error, rejected wrong, rejected correct
C = torch.tensor([1.0, 0.0, 0.0, 1.0])
E = V * (1 - C)


def test_audit_correction_is_unbiased_over_audit_draws():  # invariant 1
    gen = torch.Generator().manual_seed(0)
    rho, mu, n = 0.2, 2.0, 40000
    draws = torch.stack([draw_audits(4, rho, gen) for _ in range(n)])
    mean = corrected_reward(V, C, draws, rho, mu).mean(0)
    assert torch.allclose(mean, V - mu * E, atol=0.05)
    sym = corrected_reward(V, C, draws, rho, mu, "symmetric").mean(0)
    assert torch.allclose(sym, V + mu * (C - V), atol=0.05)  # = V - mu E wherever C <= V


def test_unaudited_samples_get_exactly_the_verifier_reward():  # invariant 2
    for variant in ("minimal", "symmetric"):
        assert torch.equal(corrected_reward(V, C, torch.zeros(4), 0.1, 5.0, variant), V)
    mixed = corrected_reward(V, C, torch.tensor([0.0, 1.0, 0.0, 1.0]), 0.1, 2.0)
    assert mixed.tolist() == pytest.approx([1.0, 1.0 - 20.0, 0.0, 0.0])


def bandit_gradient(mu: float, logits: torch.Tensor) -> torch.Tensor:
    """Expected policy gradient E_pi[r (phi - E_pi phi)] of a one-hot log-linear 3-arm bandit
    {correct-accepted, error-accepted, rejected}, with r averaged over audit draws."""
    v, c = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])
    gen = torch.Generator().manual_seed(1)
    draws = torch.stack([draw_audits(3, 0.1, gen) for _ in range(20000)])
    r = corrected_reward(v, c, draws, 0.1, mu).mean(0)
    pi = torch.softmax(logits, 0)
    return pi * (r - (pi * r).sum())


@pytest.mark.parametrize("logits", [[0.0, 0.0, 0.0], [-1.0, 1.0, 0.5], [1.0, -2.0, 0.0]])
def test_selective_control_in_a_three_arm_bandit(logits):  # invariant 3
    logits = torch.tensor(logits)
    g = bandit_gradient(2.0, logits)
    assert g[0] > 0 and g[1] < 0  # mu > 1: correct arm up, accepted-error arm down
    g0 = bandit_gradient(0.0, logits)
    assert g0[1] > 0  # pure RLVR: the accepted error out-competes the rejected arm and rises


def test_full_audit_is_deterministic():  # invariant 4
    for seed in range(3):
        audited = draw_audits(4, 1.0, torch.Generator().manual_seed(seed))
        assert torch.equal(corrected_reward(V, C, audited, 1.0, 2.0), V - 2.0 * E)


def test_imperfect_verifier_accepts_every_correct_answer_and_a_seeded_share_of_wrong_ones():
    opts = RL.options_for("audit_correction").model_copy(update={"false_accept": 0.3})
    assert all(imperfect_verifier(True, p, "q", "y", opts) == 1.0 for p in (True, False))
    wrong = [imperfect_verifier(False, True, "q", str(i), opts) for i in range(4000)]
    assert sum(wrong) / len(wrong) == pytest.approx(0.3, abs=0.03)
    assert wrong == [imperfect_verifier(False, True, "q", str(i), opts) for i in range(4000)]  # fixed per answer
    assert not any(imperfect_verifier(False, False, "q", str(i), opts) for i in range(200))  # unparsable: rejected
    other = opts.model_copy(update={"seed": 1})
    assert wrong != [imperfect_verifier(False, True, "q", str(i), other) for i in range(4000)]


def test_a_shared_flaw_accepts_the_same_wrong_answers_on_every_prompt():
    """`flaw: shared` draws a wrong answer's coin once for all prompts (a flaw a policy can learn once); the
    per-prompt default draws it again for each prompt. Both accept the same share of wrong answers."""
    per_prompt = RL.options_for("audit_correction").model_copy(update={"false_accept": 0.3})
    shared = per_prompt.model_copy(update={"flaw": "shared"})
    answers = [str(i) for i in range(2000)]
    for opts in (per_prompt, shared):
        accepted = [imperfect_verifier(False, True, "q1", y, opts) for y in answers]
        assert sum(accepted) / len(accepted) == pytest.approx(0.3, abs=0.03)
    on = lambda prompt, opts: [imperfect_verifier(False, True, prompt, y, opts) for y in answers]  # noqa: E731
    assert on("q1", shared) == on("q2", shared) == on("q3", shared)
    assert on("q1", per_prompt) != on("q2", per_prompt)
    assert all(imperfect_verifier(True, True, q, "x", shared) == 1.0 for q in ("q1", "q2"))  # correct answers: always accepted
    assert not any(imperfect_verifier(False, False, "q1", y, shared) for y in answers[:200])  # unparsable: rejected


def test_registered_audit_reward_matches_the_formula():
    ex = Example("q", "", "7")
    texts = ["7", "8", "9 ?", "7"]
    settings = {"false_accept": 1.0, "audit_rate": 1.0, "mu": 2.0, "seed": 3}
    got = rewards.get("audit_correction")(TASK, [ex] * 4, texts, [True] * 4, rl=rl(audit_correction=settings))
    assert got.tolist() == [1.0, -1.0, 0.0, 1.0]  # "8" is an accepted error: 1 - mu
    pure = rewards.get("audit_correction")(TASK, [ex] * 4, texts, [True] * 4, rl=rl(audit_correction={**settings, "mu": 0.0}))
    assert pure.tolist() == [1.0, 1.0, 0.0, 1.0]


# ---------------------------------------------------------------- options


def test_defaults_validate_and_live_in_params_yaml():
    assert isinstance(SDRL, SDRLOptions) and isinstance(RL.options_for("audit_correction"), AuditOptions)

    written = repo_params(PARAMS)["rl"]["options"]
    for field in SDRLOptions.model_fields:
        assert field in written["sdrl"]
    for field in AuditOptions.model_fields:
        assert field in written["audit_correction"]


@pytest.mark.parametrize("name, bad", [
    ("sdrl", {"beta_b": -0.1}), ("sdrl", {"beta_w": -1}), ("sdrl", {"strategies": {"x": ["("]}}), ("sdrl", {"typo": 1}),
    ("audit_correction", {"audit_rate": 0.0}), ("audit_correction", {"audit_rate": 1.5}),
    ("audit_correction", {"false_accept": -0.1}), ("audit_correction", {"mu": -1.0}),
    ("audit_correction", {"variant": "both"}), ("audit_correction", {"seed": "x"}), ("audit_correction", {"flaw": "global"}),
])
def test_bad_options_are_rejected(name, bad):
    with pytest.raises(UserError, match=f"rl.options.{name}"):
        resolve.updated(RL, "rl", options={name: bad})


def test_listing_a_reward_without_its_block_runs_on_its_defaults():
    options = {k: v for k, v in RL.options.items() if k != "audit_correction"}
    rewards = (config.RewardSpec(name="audit_correction", weight=1.0),)
    resolved = resolve.section(RL.model_copy(update={"options": options, "rewards": rewards}), "rl")
    assert resolved.options_for("audit_correction") == AuditOptions()
    assert resolve.section(RL.model_copy(update={"rewards": rewards}), "rl").rewards[0].name == "audit_correction"
