"""kgpo (RareDx-KGPO): the graph-graded differential reward's invariants, and the diagnosis task it runs on."""

from __future__ import annotations

import itertools

import pytest

from helpers import REPO
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix
from posttrain.rewards.kgpo import list_reward, relevance
from posttrain.tasks import build_task
from posttrain.tasks.diagnosis import parse_differential, phenotypes_of

DIAGNOSIS = ["task.name=diagnosis", "task.n_train=200", "task.n_heldout=50", "rl.rewards=[{name: kgpo, weight: 1.0}]"]


def load(*extra: str):
    return resolve.load(REPO / "params.yaml", [*DIAGNOSIS, *extra])


@pytest.fixture(scope="module", params=["dcg", "saturating"])
def setup(request):
    cfg = load(f"rl.options.kgpo.aggregation={request.param}")
    task = build_task(cfg.task)
    return task, task.graph, cfg.rl.options_for("kgpo")


def case(graph):
    """A gold subtype, its patient phenotypes, and nodes by relation to it."""
    gold = next(d for d in graph.diseases if d.parent is not None)
    parent = gold.parent
    sibling = next(d.node for d in graph.diseases if d.parent == parent and d.node != gold.node)
    same_group = next(d.node for d in graph.diseases if d.group == gold.group and d.parent is None and d.node != parent)
    far = next(d.node for d in graph.diseases if d.group != gold.group)
    patient = frozenset(sorted(gold.phenotypes)[:3])
    return gold.node, patient, {"parent": parent, "sibling": sibling, "group": same_group, "far": far}


def name(node: int, prefix: str = "D") -> str:
    return f"{prefix}{node:02d}"


def test_gold_alone_at_rank_one_is_the_maximum(setup):
    task, graph, opts = setup
    gold, patient, rel = case(graph)
    best = list_reward(graph, [name(gold)], gold, patient, opts)
    assert best == pytest.approx(1.0)
    others = [n for n in range(len(graph.diseases)) if n != gold]
    for items in itertools.islice(itertools.permutations(others, opts.top_k), 2000):
        partial = [name(n) for n in items]
        assert list_reward(graph, partial, gold, patient, opts) <= best
    # a list of the closest relatives, and the same list with the gold moved to rank 1
    relatives = [name(rel["parent"]), name(rel["sibling"]), name(rel["group"])]
    with_gold = [name(gold), *relatives[:2]]
    if opts.aggregation == "saturating":  # strict: no gold-free list ties the exact answer
        assert list_reward(graph, relatives, gold, patient, opts) < list_reward(graph, with_gold, gold, patient, opts)
    else:  # the clipped DCG (`dcg`) lets three capped relatives reach the clip (the flaw `saturating` fixes)
        assert list_reward(graph, relatives, gold, patient, opts) <= list_reward(graph, with_gold, gold, patient, opts)


def test_partial_credit_is_below_exact_and_graded(setup):
    _, graph, opts = setup
    gold, patient, rel = case(graph)
    for node in range(len(graph.diseases)):
        if node != gold:
            assert relevance(graph, node, gold, patient, opts) < 1.0
    assert relevance(graph, gold, gold, patient, opts) == 1.0
    r = {k: relevance(graph, v, gold, patient, opts) for k, v in rel.items()}
    assert r["parent"] >= r["sibling"] >= r["group"] > r["far"] >= 0.0


def test_fabricated_or_over_budget_items_never_raise_the_reward(setup):
    _, graph, opts = setup
    gold, patient, rel = case(graph)
    base_lists = [[name(gold)], [name(rel["parent"])], [name(rel["sibling"]), name(gold)], [name(rel["far"])]]
    fabricated = "D99"
    assert graph.canonical(fabricated) is None
    for base in base_lists:
        r = list_reward(graph, base, gold, patient, opts)
        assert list_reward(graph, [*base, fabricated], gold, patient, opts) < r  # costs c_vocab
        full = (base + [name(n) for n in range(len(graph.diseases)) if name(n) not in base])[: opts.top_k]
        r_full = list_reward(graph, full, gold, patient, opts)
        for extra in range(len(graph.diseases)):
            longer = [*full, name(extra)]
            assert list_reward(graph, longer, gold, patient, opts) < r_full + 1e-12  # beyond K: no credit, c_budget


def test_duplicates_and_synonyms_add_nothing(setup):
    _, graph, opts = setup
    gold, patient, rel = case(graph)
    one = list_reward(graph, [name(rel["parent"])], gold, patient, opts)
    assert list_reward(graph, [name(rel["parent"]), name(rel["parent"], "M")], gold, patient, opts) == pytest.approx(one)
    assert list_reward(graph, [name(gold, "M")], gold, patient, opts) == pytest.approx(1.0)  # the synonym maps to the node


def test_moving_a_relevant_item_down_never_raises_the_reward(setup):
    _, graph, opts = setup
    gold, patient, rel = case(graph)
    items = [name(gold), name(rel["parent"]), name(rel["far"])]
    for lst in itertools.permutations(items):
        lst = list(lst)
        r = list_reward(graph, lst, gold, patient, opts)
        for i in range(len(lst) - 1):
            swapped = lst.copy()
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            hi = relevance(graph, graph.canonical(lst[i]), gold, patient, opts)
            lo = relevance(graph, graph.canonical(lst[i + 1]), gold, patient, opts)
            if hi >= lo:  # demoting the more relevant item
                assert list_reward(graph, swapped, gold, patient, opts) <= r + 1e-12


def test_malformed_or_unfinished_completions_score_zero(setup):
    task, graph, opts = setup
    cfg = load(f"rl.options.kgpo.aggregation={opts.aggregation}")
    ex = task.splits(0)["train"][0]
    texts = [ex.completion, "D0", "D01,,D02", "", ex.completion]
    finished = [True, True, True, True, False]
    matrix, names, _ = reward_matrix(cfg.rl.rewards, task, [ex] * 5, texts, finished, rl=cfg.rl)
    assert names == ("kgpo",)
    assert matrix[:, 0].tolist() == [pytest.approx(1.0), 0.0, 0.0, 0.0, 0.0]


def test_diagnosis_task_is_solvable_and_its_splits_disjoint():
    task = build_task(load().task)
    splits = task.splits(0)
    train, held = splits["train"], splits["heldout"]
    assert len(train) == 200 and len(held) == 50
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    assert task.splits(0) == splits
    graph = task.graph
    own = {d.node: d.phenotypes - d.inherited for d in graph.diseases}
    assert sum(len(v) for v in own.values()) == len(set().union(*own.values()))  # own phenotypes are unique
    for ex in train + held:
        gold = graph.canonical(ex.answer)
        assert phenotypes_of(ex.prompt) & own[gold]  # identifiable from the prompt
        assert task.correctness_reward(ex.completion, True, ex) == 1.0
        assert 1 <= len(parse_differential(ex.completion)) <= task.opts.top_k
        assert set(ex.prompt + ex.completion) <= set(task.alphabet())
    ex = train[0]
    assert task.hit_at("D99," + ex.answer, ex, 2) and not task.hit_at("D99," + ex.answer, ex, 1)
    assert task.sample_metrics("D99," + ex.answer, ex)["fabricated_names"] == 1.0


def test_diagnosis_settings_are_checked_up_front():
    with pytest.raises(UserError, match=r"^rl.rewards: kgpo needs task.name in \{diagnosis\}"):
        resolve.load(REPO / "params.yaml", ["rl.rewards=[{name: kgpo}]"])
    with pytest.raises(UserError, match=r"^rl.advantage: witness needs task.name in \{distribution\}"):
        resolve.load(REPO / "params.yaml", ["rl.advantage=witness"])
    with pytest.raises(UserError, match=r"task.options.diagnosis.groups"):
        load("task.options.diagnosis.groups=0")
    assert load("task.options={}").task.options_for("diagnosis") == load().task.options_for("diagnosis")  # a block left out: the defaults
    with pytest.raises(UserError, match=r"exceeds the \d+ distinct diagnosis prompts"):
        build_task(load("task.n_train=100000").task).splits(0)
    with pytest.raises(UserError, match=r"rl.options.kgpo.cap"):
        load("rl.options.kgpo.cap=1.0")
