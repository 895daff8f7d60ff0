"""The seed methods' claims (experiments/_methods.py): exactly the spec's 30 sections, every claim a results file and
every results file a method's or a base's, every docs anchor real, and the "By seed method" table of docs/claims.md
(docs/generate.py `render_methods`) counting as decided only the rows whose verdict rests on >= 3 premise-holding seeds."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

from helpers import REPO
from helpers import load_by_path as load

DOCS = REPO / "docs"
RESULTS = REPO / "experiments" / "results"
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
ANCHOR_LINK = re.compile(r"\]\(([\w./-]*)#([^)\s]+)\)")

# The numbered section headings of specs/seed_methods.md, which the repository does not publish (see test_docs.py's
# test_no_page_cites_the_unpublished_spec): transcribed verbatim, without their provenance tags in brackets.
SPEC_HEADINGS = """
## 0. Shared bases
## 1. CrossTimeEdit (+ VIGOR-his data pipeline)
## 2. GM-DPO and the GPA score (FlexBench)
## 3. PR-OPD (Privileged Representation On-policy Self-Distillation)
## 4. SIPO (Self-Instructing Policy Optimization)
## 5. RIDE (RL-Induced Direction Extrapolation)
## 6. Test-time self-distillation (counterfactual-context log-odds reward, Gibbs reweighting, beam search)
## 7. GATS (Gap-Adaptive Teacher Scheduling)
## 8. ThinkOPD (trace–response divergence routing)
## 9. TRM (Thinking Reward Model) + PD-GRPO (Pairwise Dual-Group RPO)
## 10. Parallel Power Tempering (PPT)
## 11. PACE (Pool-Aware Control of Effective Staleness)
## 12. AURA (PPO with a direction–magnitude forecast score)
## 13. BRIDGE (bilevel first-order retriever + policy)
## 14. RFPO (Reward-Free Policy Optimization)
## 15. GLIME (Generalizable Lifelong Model Editing)
## 16. VLM-Safe-RL (PPO-Lagrangian with frozen-CLIP reward shaping and augmented multiplier update)
## 17. CARE (Context-Adaptive Rubric Evolution)
## 18. ABC-Align (Adaptive Bias Correction with pseudo labels)
## 19. SDRL (Strategy-Diverse RL, correctness-gated hierarchical diversity reward)
## 20. DSP (Diffusion Subgoal Planning)
## 21. QGLAS (Quality-Gated Length Advantage Shaping)
## 22. UniOPSD (Unified On-Policy Self-Distillation, adaptive local credit arbitration)
## 23. Witness advantage (MMD witness in closed form from group outcome counts)
## 24. ASCT (Attentive Search over Counterfactual Trees)
## 25. ReSPO (Reshaped Sequence Policy Optimization)
## 26. RareDx-KGPO (knowledge-graph-grounded policy optimisation)
## 27. Selective control under partial auditing
## 28. ROFT (Retrospection-Only Fine-Tuning)
## 29. VisKG (question-specific KG representation + GDPO + negative-rationale SFT)
## 30. (In file, not in brief) MotionInsight — GRPO with motion-specific rewards
"""


M = load("experiments_methods", REPO / "experiments" / "_methods.py")
G = load("docs_generate_methods", DOCS / "generate.py")


def spec_sections(text: str) -> dict[int, str]:
    """{N: heading} of the spec's `## N. Name` headings, the shared bases (section 0) left out."""
    return {int(n): name for n, name in re.findall(r"^## (\d+)\. (.+)$", text, re.MULTILINE) if int(n) > 0}


def name_words(name: str) -> list[str]:
    """The words of a method's name outside parentheses (an acronym in parentheses need not be the spec's)."""
    return re.findall(r"[\w+-]+", re.sub(r"\([^)]*\)", "", name).lower())


def anchors(text: str) -> set[str]:
    """The anchors a page has: GitHub's heading ids (lowercased, punctuation but `-` and `_` dropped, spaces to `-`,
    a repeated id suffixed -1, -2, ...) and every explicit `<a id="...">`."""
    found: set[str] = set(re.findall(r'<a id="([^"]+)"></a>', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_methods_are_exactly_the_spec_sections():
    sections = spec_sections(SPEC_HEADINGS)
    assert sorted(sections) == list(range(1, 31))
    assert [m.number for m in M.METHODS] == list(range(1, 31))
    for method in M.METHODS:
        heading = sections[method.number].lower()
        assert all(word in heading for word in name_words(method.name)), (method.name, heading)


def test_spec_sections_and_name_words():
    assert spec_sections("## 0. Shared bases\n## 7. GATS (Gap-Adaptive)  \n### 7.1 not a section\n") == {7: "GATS (Gap-Adaptive)  "}
    assert name_words("Test-time self-distillation (TTSD)") == ["test-time", "self-distillation"]
    assert name_words("TRM + PD-GRPO") == ["trm", "+", "pd-grpo"]


def test_every_claim_is_a_results_file_and_every_results_file_is_claimed():
    results = {p.stem for p in RESULTS.glob("*.json")}
    named = [m.claim for method in M.METHODS for m in method.claims] + [m.claim for m in M.BASES]
    assert set(named) - results == set(), "claims without a results file"
    assert results - set(named) == set(), "results files that no method (nor base) claims"
    shared = {claim for claim in named if named.count(claim) > 1}
    listed = [m for method in M.METHODS for m in method.claims] + list(M.BASES)
    assert all(m.arms for m in listed if m.claim in shared), "a claim listed twice must say which of its rows each listing counts"


def test_a_method_without_a_claim_says_why():
    for method in M.METHODS:
        assert method.claims or method.note, f"{method.name}: no claim and no note"
        assert all(m.model for m in method.claims)


def test_the_arms_a_method_claims_are_in_its_claims_rows():
    for measured in [m for method in M.METHODS for m in method.claims] + list(M.BASES):
        rows = json.loads((RESULTS / f"{measured.claim}.json").read_text())["comparisons"]
        arms = {r["better"] for r in rows} | {r["worse"] for r in rows}
        assert set(measured.arms) <= arms, (measured.claim, set(measured.arms) - arms)


def test_every_docs_anchor_exists():
    missing = []
    for method in M.METHODS:
        page, _, anchor = method.doc.partition("#")
        assert (DOCS / page).is_file(), method.doc
        if anchor and anchor not in anchors((DOCS / page).read_text()):
            missing.append(method.doc)
    assert not missing, f"docs anchors that no heading makes: {missing}"


def test_the_links_into_claims_md_land_on_anchors():
    """Every `#anchor` link of docs/claims.md to itself and of README.md to docs/claims.md resolves: each method's row,
    each claim's first row, the premise failures."""
    claims = (DOCS / "claims.md").read_text()
    have = anchors(claims)
    links = [a for page, a in ANCHOR_LINK.findall(FENCE.sub("", claims)) if page == ""]
    links += [a for page, a in ANCHOR_LINK.findall((REPO / "README.md").read_text()) if page == "docs/claims.md"]
    assert {f"method-{n}" for n in range(1, 31)} <= set(links)
    assert not set(links) - have, f"links to anchors docs/claims.md lacks: {sorted(set(links) - have)}"


def test_anchors_follow_github_ids():
    text = "# A page\n## PR-OPD (`pr_opd`, auxiliary)\n## Notes\n## Notes\n```\n# not a heading\n```\n| <a id=\"claim-x\"></a>`x` |\n"
    assert anchors(text) == {"a-page", "pr-opd-pr_opd-auxiliary", "notes", "notes-1", "claim-x"}


def row(better: str, worse: str, verdict: str, declared: bool, held: list[int]) -> dict:
    return {"metric": "m", "better": better, "worse": worse, "verdict": verdict,
            "premise": {"declared": declared, "held_seeds": held, "seeds_used": held, "failures": []}}


def write(results, claim: str, seeds: list[int], rows: list[dict]) -> None:
    (results / f"{claim}.json").write_text(json.dumps({"claim": claim, "seeds": seeds, "comparisons": rows}))


def test_the_decision_counts_only_rows_decided_on_three_premise_holding_seeds(tmp_path):
    write(tmp_path, "mixed", [0, 1, 2, 3], [
        row("a", "b", "reproduced", True, [0, 1, 2]),                      # 3 of 4 held: decided
        row("a", "c", "premise failed (2 of 4 seeds held)", True, [0, 1]),  # not decided
        row("a", "d", "identical arms", True, [0, 1, 2, 3]),               # no comparison
        row("e", "b", "contradicted", True, [0, 1, 2, 3]),                 # another method's arm
    ])
    write(tmp_path, "failed", [0, 1, 2], [row("x", "y", "premise failed (0 of 3 seeds held)", True, []) for _ in range(2)])
    write(tmp_path, "two_seeds", [0, 1], [row("x", "y", "inconclusive", False, [0, 1])])  # no premise, but 2 seeds
    write(tmp_path, "plain", [0, 1, 2], [row("x", "y", "inconclusive", False, [0, 1, 2]), row("x", "z", "reproduced", False, [0, 1, 2])])
    methods = SimpleNamespace(MIN_SEEDS=3, BASES=(M.Measured("plain", "an MLP", what="a base"),), METHODS=(
        M.Method(1, "Mixed", "x.md", (M.Measured("mixed", "tiny", ("a",)),)),
        M.Method(2, "Failed", "y.md", (M.Measured("failed", "tiny"),)),
        M.Method(3, "Few", "z.md", (M.Measured("two_seeds", "tiny"), M.Measured("absent", "tiny"))),
        M.Method(4, "None", "w.md", note="not measured here"),
    ))
    lines = G.render_methods(tmp_path, methods).splitlines()
    cells = {line.split(" | ")[1]: line.split(" | ")[-1].rstrip(" |") for line in lines if line.startswith('| <a id="method-')}
    assert cells == {
        "[Mixed](x.md)": "**1 decided**: 1 reproduced (not decided: 1 identical arms, 1 premise failed)",
        "[Failed](y.md)": "**none decided**: premise failed on every row (2 rows; [failures](#premise-failures))",
        "[Few](z.md)": "**none decided**: 1 under 3 seeds; no results file: `absent`",
        "[None](w.md)": "**no harness claim**; not measured here",
    }
    assert '| <a id="method-1"></a>1 | [Mixed](x.md) | [`mixed`](#claim-mixed) (rows naming `a`) | tiny |' in lines[2]
    assert "| [`plain`](#claim-plain) | a base | an MLP | **2 decided**: 1 reproduced, 1 inconclusive |" in lines


def test_the_readme_index_links_every_method_to_its_row():
    index = G.render_method_index(M)
    readme = (REPO / "README.md").read_text()
    assert index in readme and len(readme.splitlines()) <= 150
    for method in M.METHODS:
        assert f"{method.number} | [{method.name}](docs/claims.md#method-{method.number})" in index


def test_a_construction_check_is_not_counted_as_a_decided_row(tmp_path):
    write(tmp_path, "checked", [0, 1, 2], [row("a", "b", "inconclusive", True, [0, 1, 2]),
                                           {**row("a", "c", "reproduced", True, [0, 1, 2]), "construction_check": True}])
    methods = SimpleNamespace(MIN_SEEDS=3, BASES=(), METHODS=(M.Method(1, "Checked", "x.md", (M.Measured("checked", "tiny"),)),))
    line = next(x for x in G.render_methods(tmp_path, methods).splitlines() if x.startswith('| <a id="method-1"'))
    assert line.endswith("| **1 decided**: 1 inconclusive |")
