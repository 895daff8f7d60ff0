"""The claims harness (experiments/_claims.py): t-intervals, verdicts, the per-claim summary, and the generated
claims table of docs/claims.md (docs/generate.py) on hand-made results."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO
from helpers import load_by_path as load


H = load("claims_harness", REPO / "experiments" / "_claims.py")


def test_t_interval_by_hand():
    mean, low, high = H.t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert mean == 2.0 and low == pytest.approx(2.0 - half) and high == pytest.approx(2.0 + half)
    assert math.isnan(H.t_interval([0.5])[1])  # one seed: no interval


@pytest.mark.parametrize("low, high, lower_is_better, expected", [
    (0.1, 0.3, False, "reproduced"), (-0.3, -0.1, False, "contradicted"), (-0.1, 0.2, False, "inconclusive"),
    (-0.3, -0.1, True, "reproduced"), (0.1, 0.3, True, "contradicted"), (math.nan, math.nan, False, "inconclusive"),
])
def test_verdict(low, high, lower_is_better, expected):
    assert H.verdict(low, high, lower_is_better) == expected


def seed_result(a: float, b: float) -> dict:
    return {"table": [{"arm": "new", "score": a}, {"arm": "old", "score": b}]}


def test_summary_pairs_the_arms_by_seed(monkeypatch):
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old")])
    # a consistent +0.1 gain on top of a large seed-to-seed spread: paired, the difference is clear
    rows = H.summarise("toy", [seed_result(0.3, 0.2), seed_result(0.7, 0.6), seed_result(0.51, 0.4)])
    (row,) = rows
    assert row["better_values"] == [0.3, 0.7, 0.51] and row["worse_values"] == [0.2, 0.6, 0.4]
    assert row["diff_mean"] == pytest.approx(0.1033, abs=1e-4) and row["verdict"] == "reproduced"
    assert row["better_ci"][0] < row["worse_mean"]  # the arms' own intervals overlap; the paired difference does not
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old", lower=True)])
    assert H.summarise("toy", [seed_result(0.3, 0.2), seed_result(0.7, 0.6), seed_result(0.51, 0.4)])[0]["verdict"] == "contradicted"
    # a comparison naming an arm the run left out (e.g. reward_model_rl --arms) is skipped, the others stay
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "absent"), H.compare("score", "new", "old")])
    assert [(r["better"], r["worse"]) for r in H.summarise("toy", [seed_result(0.3, 0.2), seed_result(0.7, 0.6)])] == [("new", "old")]


def test_every_claim_experiment_has_comparisons_and_a_claims_entry():
    runner = load("claims_runner", REPO / "experiments" / "claims.py")
    # not on the harness: the curation's geometric check (a single run over its own seeds), and the async simulator,
    # which loops over --seeds itself
    own_seed_loop = {"async_simulator"}
    scripts = {p.stem for p in (REPO / "experiments").glob("*.py") if not p.stem.startswith("_")} - {"claims", "curate_geometric"} - own_seed_loop
    assert set(runner.CLAIMS) <= set(H.COMPARISONS) and {script for script, _ in runner.CLAIMS.values()} == scripts
    for script in scripts:
        text = (REPO / "experiments" / f"{script}.py").read_text()
        claims = [name for name, (s, _) in runner.CLAIMS.items() if s == script]
        # a script with one claim runs it by its own name; one with several picks the claim from its command line
        assert f'C.run_seeds(main, "{script}"' in text if claims == [script] else "C.run_seeds(main, claim_of(" in text


def test_claims_table_is_generated_from_the_results(tmp_path):
    generate = load("docs_generate_claims", REPO / "docs" / "generate.py")
    (tmp_path / "docs").mkdir()
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    rows = H.summarise("witness_vs_grpo", [{"table": [{"arm": a, "tv_after": v} for a, v in zip(("grpo", "witness_reward", "witness_raw"), vs)]}
                                           for vs in ((0.5, 0.4, 0.3), (0.6, 0.45, 0.35), (0.55, 0.42, 0.36))])
    command = ".venv/bin/python experiments/witness_vs_grpo.py --steps 60 --seeds 3"
    (tmp_path / "experiments" / "results" / "witness_vs_grpo.json").write_text(json.dumps({"seeds": [0, 1, 2], "command": command, "comparisons": rows}))
    page = tmp_path / "docs" / "claims.md"
    page.write_text("# claims\n\n<!-- claims -->\nold\n<!-- /claims -->\n")
    assert generate.update(write=False, docs=page.parent, registries={}) == ["docs/claims.md is stale: its registry tables differ "
                                                                              "from the registries or its claims table from experiments/results/"]
    assert generate.update(write=True, docs=page.parent, registries={}) == []
    text = page.read_text()
    assert '| <a id="claim-witness_vs_grpo"></a>`witness_vs_grpo` | tv_after | witness_reward < grpo |' in text  # its first row: the anchor
    assert "| `witness_vs_grpo` | tv_after | witness_raw < grpo |" in text and text.count("**reproduced**") == 3
    assert f"`{command}`" in text and generate.update(write=False, docs=page.parent, registries={}) == []


def test_the_recorded_command_leaves_out_where_it_logged():
    argv = ["--steps", "60", "--tracking-uri", "sqlite:////tmp/x.db", "--seeds", "3", "--json", str(REPO / "experiments" / "results" / "a.json")]
    assert H.reproducible(argv) == ["--steps", "60", "--seeds", "3", "--json", "experiments/results/a.json"]


def one_seed_run(seed: int, a: float, b: float, steps: str = "60") -> dict:
    command = f".venv/bin/python experiments/toy.py --steps {steps} --no-mlflow --seed {seed} --seeds 1 --json /tmp/toy_s{seed}.json"
    return {"claim": "toy", "seeds": [seed], "command": command, "comparisons": [], "per_seed": [seed_result(a, b)]}


def test_runs_on_different_seeds_merge_into_the_one_run_over_all_of_them(monkeypatch, tmp_path):
    """Seeds run in parallel processes (`--seed S --seeds 1`) merge into what one `--seeds 3` run writes: per-seed
    results in seed order, the comparisons over all of them, the command of the whole range."""
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old")])
    runs = [one_seed_run(2, 0.51, 0.4), one_seed_run(0, 0.3, 0.2), one_seed_run(1, 0.7, 0.6)]
    merged = H.merge(runs, REPO / "experiments" / "results" / "toy.json")
    assert merged["seeds"] == [0, 1, 2] and merged["per_seed"] == [seed_result(0.3, 0.2), seed_result(0.7, 0.6), seed_result(0.51, 0.4)]
    assert merged["comparisons"] == H.summarise("toy", merged["per_seed"]) and merged["comparisons"][0]["verdict"] == "reproduced"
    assert merged["command"] == ".venv/bin/python experiments/toy.py --steps 60 --no-mlflow --seeds 3 --json experiments/results/toy.json"
    assert H.merge(runs[1:])["command"].endswith("--no-mlflow --seeds 2") and H.merge(runs[:1])["command"].endswith("--seed 2 --seeds 1")
    with pytest.raises(SystemExit, match="different commands"):
        H.merge([one_seed_run(0, 0.3, 0.2), one_seed_run(1, 0.7, 0.6, steps="40")])
    with pytest.raises(SystemExit, match="twice"):
        H.merge([one_seed_run(0, 0.3, 0.2), one_seed_run(0, 0.3, 0.2)])
    with pytest.raises(SystemExit, match="contiguous"):
        H.merge([one_seed_run(0, 0.3, 0.2), one_seed_run(2, 0.7, 0.6)])
    with pytest.raises(SystemExit, match="different claims"):
        H.merge([one_seed_run(0, 0.3, 0.2), {**one_seed_run(1, 0.7, 0.6), "claim": "other"}])


def test_a_failed_premise_withholds_the_verdict(monkeypatch):
    """Issue 34: seeds whose premise failed are left out, and with fewer than 3 left no verdict is given; a premise
    the run never recorded fails as `not recorded`; a premise about other arms leaves a row alone."""
    P = H.premises
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old"), H.compare("score", "old", "base")])
    premise = P.Premise("teacher lead", lambda r: r["lead"], at_least=0.05, arms=("new",))
    monkeypatch.setitem(P.PREMISES, "toy", [premise])
    results = [{**seed_result(a, b), "lead": lead} for a, b, lead in ((0.3, 0.2, 0.1), (0.7, 0.6, 0.0), (0.51, 0.4, 0.2))]
    for r, base in zip(results, (0.1, 0.5, 0.3)):
        r["table"].append({"arm": "base", "score": base})
    rows = H.summarise("toy", results, seeds=[10, 11, 12])
    new_vs_old, old_vs_base = rows
    # without the premise this row is "reproduced" (test_summary_pairs_the_arms_by_seed); seed 11's teacher had no lead
    assert new_vs_old["verdict"] == "premise failed (2 of 3 seeds held)"
    assert new_vs_old["premise"]["held_seeds"] == [10, 12] and new_vs_old["premise"]["failures"] == ["seed 11: teacher lead >= 0.05: 0"]
    assert old_vs_base["verdict"] == "reproduced" and old_vs_base["premise"]["held_seeds"] == [10, 11, 12]
    # a fourth seed where it held: three seeds carry the verdict, computed over them only
    more = [*results, {**seed_result(0.5, 0.35), "lead": 0.3}]
    more[3]["table"].append({"arm": "base", "score": 0.2})
    row = H.summarise("toy", more, seeds=[10, 11, 12, 13])[0]
    assert row["verdict"] == "reproduced" and row["premise"]["seeds_used"] == [10, 12, 13]
    assert row["diff_mean"] == pytest.approx((0.1 + 0.11 + 0.15) / 3)
    # not recorded: fails, never assumed
    unrecorded = [{k: v for k, v in r.items() if k != "lead"} for r in more]
    row = H.summarise("toy", unrecorded)[0]
    assert row["verdict"] == "premise failed (0 of 4 seeds held)" and "teacher lead >= 0.05: not recorded" in row["premise"]["failures"][0]
    assert H.premise_table("toy", more, [10, 11, 12, 13])[1] == {"seed": 11, "premise": "teacher lead >= 0.05", "value": 0.0, "held": False}


def test_a_run_with_too_few_seeds_says_so_not_that_a_premise_failed(monkeypatch):
    """Two seeds on which every premise held give no verdict (3 are needed), and the row says why: too few seeds."""
    P = H.premises
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old")])
    monkeypatch.setitem(P.PREMISES, "toy", [P.Premise("teacher lead", lambda r: r["lead"], at_least=0.05)])
    results = [{**seed_result(a, b), "lead": 0.2} for a, b in ((0.3, 0.2), (0.7, 0.6))]
    row = H.summarise("toy", results, seeds=[0, 1])[0]
    assert row["verdict"] == "too few seeds (2, at least 3 needed)" and row["premise"]["held_seeds"] == [0, 1]
    results[1]["lead"] = 0.0
    assert H.summarise("toy", results, seeds=[0, 1])[0]["verdict"] == "premise failed (1 of 2 seeds held)"


def test_identical_arms_are_flagged_not_compared(monkeypatch):
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old")])
    (row,) = H.summarise("toy", [seed_result(0.3, 0.3), seed_result(0.5, 0.5), seed_result(0.4, 0.4)])
    assert row["verdict"] == "identical arms"


def test_every_declared_premise_names_a_claim_with_comparisons():
    assert set(H.premises.PREMISES) <= set(H.COMPARISONS)
    for claim, declared in H.premises.PREMISES.items():
        arms = {a for c in H.COMPARISONS[claim] for a in (c.better, c.worse)}
        for p in declared:
            assert set(p.arms) <= arms, (claim, p.name, p.arms)


def test_the_worked_solutions_of_the_sft_warm_up_verify_in_the_rewards_format():
    """The SFT completions of examples/smollm2 and smollm2_sft_rl (generate.py --answer-format "#### {answer}"):
    every template's solution, closing words replaced by `#### N`, keeps its calculation and carries the answer where
    the example's answer_pattern reads it."""
    import random
    import re

    generator = load("word_problems_generate", REPO / "examples" / "word_problems" / "generate.py")
    pattern = re.compile(r"####\s*(-?[0-9]+)")  # examples/smollm2/params.yaml's answer_pattern
    r = random.Random(0)
    for kind, template in generator.TEMPLATES.items():
        _, solution, answer, steps = template(r)
        text = generator.worked({"solution": solution, "answer": str(answer)}, "#### {answer}")
        assert pattern.findall(text) == [str(answer)] and text.count("=") == steps, (kind, text)
    with pytest.raises(SystemExit, match="unexpected solution form"):
        generator.worked({"solution": "12, the answer", "answer": "12"}, "#### {answer}")


def test_a_premise_about_a_pair_concerns_only_the_row_comparing_them(monkeypatch):
    """A premise on two arms' difference from each other (flow_gdpo_vs_sum: the two RL arms' weights apart) withholds
    only their row, not their rows against a third arm; a premise on one arm concerns every row naming it."""
    P = H.premises
    apart = P.Premise("new and old apart", lambda r: r["apart"], at_least=0.1, pair=("old", "new"))
    moved = P.Premise("new moved", lambda r: r["moved"], at_least=0.1, arms=("new",))
    assert apart.concerns("new", "old") and apart.concerns("old", "new") and not apart.concerns("new", "base")
    assert moved.concerns("new", "base") and moved.concerns("base", "new") and not moved.concerns("old", "base")
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old"), H.compare("score", "new", "base"),
                                               H.compare("score", "old", "base")])
    monkeypatch.setitem(P.PREMISES, "toy", [apart, moved])
    results = [{**seed_result(a, b), "apart": 0.0, "moved": moved_by} for a, b, moved_by in ((0.3, 0.2, 0.5), (0.7, 0.6, 0.5), (0.51, 0.4, 0.0))]
    for r, base in zip(results, (0.1, 0.5, 0.31)):
        r["table"].append({"arm": "base", "score": base})
    verdicts = [r["verdict"] for r in H.summarise("toy", results)]
    assert verdicts == ["premise failed (0 of 3 seeds held)", "premise failed (2 of 3 seeds held)", "reproduced"]


def test_a_construction_check_is_marked_in_its_row(monkeypatch):
    """A row that holds by the setup's construction (viskg: the graph is a sub-path of the caption) gets its verdict
    and carries `construction_check`, which docs/generate.py leaves out of a method's decided rows; other rows carry no flag."""
    monkeypatch.setitem(H.COMPARISONS, "toy", [H.compare("score", "new", "old"),
                                               H.compare("score (construction check)", "new", "old", column="score", construction_check=True)])
    plain, check = H.summarise("toy", [seed_result(0.3, 0.2), seed_result(0.7, 0.6), seed_result(0.51, 0.4)])
    assert "construction_check" not in plain and check["construction_check"] is True
    assert check["verdict"] == plain["verdict"] == "reproduced" and check["metric"] == "score (construction check)"


def test_the_self_distillation_claims_read_what_their_script_writes(monkeypatch):
    """smollm2_sipo's and smollm2_opsd's comparisons and premises against results shaped as smollm2_self_distill.py
    writes them: SIPO's rows need its token signal in all-fail groups, every row the teacher's lead, each arm a run of
    its own; the script names the claim from its arm."""
    def arm(name, accuracy, **extra):
        return {"arm": name, "wp_greedy_accuracy": accuracy, "wp_sampled_accuracy": accuracy / 2, **extra}

    def seed(i, method, spread=0.04, lead=0.28):
        table = [arm("example", 0.26 + i / 100), arm("grpo", 0.2 + i / 50), arm(method, 0.3 + i / 30, all_fail_token_spread=spread)]
        return {"teacher": {"lead": lead}, "completion_length_gap": {method: 3.0}, "table": table}

    for method in ("sipo", "opsd"):
        rows = H.summarise(f"smollm2_{method}", [seed(i, method) for i in range(3)], seeds=[0, 1, 2])
        assert {(r["better"], r["worse"]) for r in rows} == {(method, "example"), (method, "grpo")}
        assert all(r["verdict"] in ("reproduced", "contradicted", "inconclusive") for r in rows)
        unread = H.summarise(f"smollm2_{method}", [seed(i, method, lead=0.0) for i in range(3)], seeds=[0, 1, 2])
        assert all(r["verdict"].startswith("premise failed") for r in unread)  # a teacher that does not read the hint
    silent = H.summarise("smollm2_sipo", [seed(i, "sipo", spread=0.0) for i in range(3)], seeds=[0, 1, 2])
    assert all(r["verdict"].startswith("premise failed") for r in silent)
    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    script = load("smollm2_self_distill_script", REPO / "experiments" / "smollm2_self_distill.py")
    assert script.claim_of(["--arms", "opsd", "--threads", "1"]) == "smollm2_opsd" and script.claim_of(["--arms", "sipo"]) == "smollm2_sipo"
    with pytest.raises(SystemExit, match="each arm is its own claim"):
        script.claim_of(["--arms", "sipo,opsd"])


def test_the_real_checkpoint_samplers_claim_reads_what_its_script_writes(monkeypatch):
    """smollm2_samplers' comparisons and premises against results shaped as smollm2_samplers.py writes them (its `arms`):
    short answers withhold every row, contexts that do not move the checkpoint withhold TTSD's rows only, chains that
    accept every move withhold the power / PPT rows only; the seeds' problem slices are disjoint."""
    def seed(i, tokens=35.0, c_plus=0.3, acceptance=0.7):
        arms = {name: {"accuracy": 0.1 + i / 20 + j / 100, "forward_tokens": 100.0} for j, name in enumerate(
            ("greedy", "temperature", "beam", "power", "ppt", "ttsd", "beam_wide", "power_matched", "temperature_vote",
             "context_plain", "context_positive", "context_negative"))}
        arms["greedy"]["generated_tokens"] = tokens
        arms["context_positive"]["accuracy"], arms["context_negative"]["accuracy"] = c_plus, 0.1
        arms["power"]["mh_acceptance"] = acceptance
        return {"arms": arms, "table": [{"arm": a, **v} for a, v in arms.items()]}

    def verdicts(**kw):
        return {(r["better"], r["worse"]): r["verdict"] for r in H.summarise("smollm2_samplers", [seed(i, **kw) for i in range(3)], seeds=[0, 1, 2])}

    held = verdicts()
    assert len(held) == 9 and all(not v.startswith("premise failed") for v in held.values())
    assert all(v.startswith("premise failed") for v in verdicts(tokens=3.0).values())
    unmoved = verdicts(c_plus=0.1)
    assert {k for k, v in unmoved.items() if v.startswith("premise failed")} == {k for k in held if "ttsd" in k}
    stuck = verdicts(acceptance=0.99)
    assert {k for k, v in stuck.items() if v.startswith("premise failed")} == {k for k in held if {"power", "ppt", "power_matched"} & set(k)}
    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    script = load("smollm2_samplers_script", REPO / "experiments" / "smollm2_samplers.py")
    slices = [script.problems(list(range(200)), 40, s) for s in range(5)]
    assert all(len(s) == 40 for s in slices) and len(set().union(*map(set, slices))) == 200
    assert script.problems(list(range(200)), 40, 0) == slices[0]  # the same draw every time
    with pytest.raises(SystemExit, match="past the 200 held-out problems"):
        script.problems(list(range(200)), 40, 5)


def test_the_ttsd_reward_claim_reads_what_its_script_writes(monkeypatch):
    """smollm2_ttsd_reward's comparisons and premise against results shaped as smollm2_ttsd_reward.py writes them: every
    row waits for room to pick (pass@N above one sample)."""
    def seed(i, oracle=0.5):
        arms = {name: {"accuracy": 0.1 + i / 20 + j / 50} for j, name in enumerate(("temperature", "log_odds", "tilted", "likelihood", "vote"))}
        arms["oracle"] = {"accuracy": oracle}
        return {"arms": arms, "table": [{"arm": a, **v} for a, v in arms.items()]}

    rows = H.summarise("smollm2_ttsd_reward", [seed(i) for i in range(3)], seeds=[0, 1, 2])
    assert len(rows) == 5 and all(not r["verdict"].startswith("premise failed") for r in rows)
    assert all(r["verdict"].startswith("premise failed") for r in H.summarise("smollm2_ttsd_reward", [seed(i, oracle=0.15) for i in range(3)],
                                                                               seeds=[0, 1, 2]))


class _Answers:
    """A task stand-in: the answer is the text, right when it equals the example's answer."""

    @staticmethod
    def parse(text):
        return text or None

    @staticmethod
    def correctness_reward(text, finished, example):
        return float(text == example.answer)


def test_ttsd_reward_picks_read_the_scores_they_name(monkeypatch):
    """Each pick keeps the sample its score ranks first; the AUC counts a problem's (right, wrong) pairs, ties a half."""
    import torch

    from posttrain.eval.best_of_n import auc
    from posttrain.tasks import Example

    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    script = load("smollm2_ttsd_reward_script", REPO / "experiments" / "smollm2_ttsd_reward.py")
    held = [Example("a", "", "1"), Example("b", "", "2")]
    texts = ["0", "1", "0", "0", "2", "2"]  # problem a: wrong, right, wrong; problem b: wrong, right, right
    r = [0.0, 1.0, -1.0, 5.0, 2.0, 2.0]  # the log-odds: a's right answer first; b's wrong one first
    base_sum = [0.0, -9.0, 0.0, 0.0, 0.0, 0.0]  # the tilt (beta 1) keeps a's first sample, b's wrong one
    base_mean = [0.0, 0.0, 1.0, -1.0, 0.0, 2.0]
    out = script.picks(_Answers, held, texts, [True] * 6, 3, r, base_sum, base_mean, beta=1.0)
    assert {k: v["accuracy"] for k, v in out.items()} == {"temperature": 0.0, "log_odds": 0.5, "tilted": 0.0, "likelihood": 0.5,
                                                           "vote": 0.5, "oracle": 1.0}
    # pairs: a (1.0 vs 0.0, -1.0): 2 above; b (2.0, 2.0 vs 5.0): 0 above
    assert out["log_odds"]["auc"] == 2 / 4 and out["log_odds"]["pairs"] == 4
    assert auc(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])) == 1.5 / 2  # one right answer: a tie and a win
    example = Example("3+4=", "7", "7", system="You add.")
    assert script.framed(example, "Check.", "before").prompt == "Check.\n\n3+4="
    assert script.framed(example, "Check.", "after").prompt == "3+4=\n\nCheck."
    assert script.framed(example, "Check.", "system").system == "You add. Check."


def test_ttsd_reward_scores_are_the_samplers_own_log_probs(chat_checkpoints, monkeypatch):
    """Scoring a tiny chat checkpoint's temperature-1 samples under their own prompts gives back the log-probs the
    sampler recorded (sum and per-token mean), in chunks of any size; a context before the problem changes them."""
    import torch

    from posttrain.models import load_pretrained
    from posttrain.rollout.samplers import SampleRequest, draw
    from posttrain.tasks import Example

    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    script = load("smollm2_ttsd_reward_script", REPO / "experiments" / "smollm2_ttsd_reward.py")
    model, tok = load_pretrained(chat_checkpoints["llama"])
    held = [Example("12+34=", "46", "46", system="You add numbers."), Example("01+02=", "3", "3", system="You add numbers.")]
    sampled = draw("temperature", model, tok, held, SampleRequest(5, 3, 1.0, (), 2), None, torch.Generator().manual_seed(0))
    rows = [e for e in held for _ in range(3)]
    mask = sampled.samples.completion_mask.float()
    recorded = (sampled.samples.logp * mask).sum(-1)
    for chunk in (1, 4, 16):
        total, mean = script.scored(model, tok, rows, sampled.samples, chunk)
        assert torch.allclose(total, recorded, atol=1e-4) and torch.allclose(mean, recorded / mask.sum(-1).clamp(min=1.0), atol=1e-4)
    told, _ = script.scored(model, tok, [script.framed(e, "Be careful.", "before") for e in rows], sampled.samples, 4)
    assert not torch.allclose(told, recorded, atol=1e-3)
