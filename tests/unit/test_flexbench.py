"""FlexBench-like GPA / WHR invariants and its caption pairs."""

from __future__ import annotations

import random

import pytest

from posttrain.data import flexbench as F
from posttrain.data.flexbench import Actor, Shot


SHOT = Shot((Actor("p1", "raises", "left arm", "standing"), Actor("p2", "kicks", "right leg", "sitting")))


def score(caption: str) -> float:
    return F.gpa(F.judge(caption, SHOT))


def test_perfect_caption_scores_100_and_no_hallucination():
    j = F.judge(SHOT.reference(), SHOT)
    assert F.gpa(j) == 100.0 and F.weighted_hallucination_rate(j) == 0.0 and F.substantive_action_score(j) == 100.0


def test_omission_scores_at_least_as_much_as_a_wrong_assertion():
    omitted = "p1 standing raises left arm . p2 sitting kicks ."
    wrong = "p1 standing raises left arm . p2 sitting kicks left leg ."
    assert score(omitted) >= score(wrong)
    assert score(omitted) == pytest.approx(100 * (12 - 2) / 12) and score(wrong) == pytest.approx(100 * (12 - 2 - 2) / 12)
    assert F.weighted_hallucination_rate(F.judge(omitted, SHOT)) == 0.0


def test_fabricated_action_strictly_lowers_gpa():
    base = SHOT.reference()
    assert score(base + " p3 waves right arm .") < score(base)
    assert score("p1 raises .") > score("p1 raises . p4 swings left leg .")
    duplicate = base + " p1 kicks ."  # a second story about the same person is fabricated too
    assert score(duplicate) == pytest.approx(100 * (12 - 3) / 12)


def test_wrong_action_costs_more_than_wrong_state():
    assert score("p1 standing lowers left arm . p2 sitting kicks right leg .") < score("p1 kneeling raises left arm . p2 sitting kicks right leg .")


def test_gpa_is_clipped_and_malformed_clauses_assert_nothing():
    junk = " ".join(f"p{k} swings left leg ." for k in (3, 4, 3, 4, 3, 4))
    assert score(junk) == -100.0
    j = F.judge("left arm raises p1 . . p2", SHOT)
    assert F.gpa(j) == 0.0 and F.weighted_hallucination_rate(j) == 0.0 and j.missing == j.total


def test_caption_pairs_prefer_higher_gpa_with_severity_gap():
    shots = F.make_shots(30, seed=1)
    pairs = F.shot_pairs(shots, per_shot=3, seed=0)
    by_prompt = {s.prompt(): s for s in shots}
    assert len(pairs) > 30
    for p in pairs:
        shot = by_prompt[p.prompt]
        gap = F.gpa(F.judge(p.chosen, shot)) - F.gpa(F.judge(p.rejected, shot))
        assert gap > 0 and p.severity == pytest.approx(min(1.0, gap / 100), abs=1e-6)


def test_corruptions_never_beat_the_reference():
    rng = random.Random(0)
    for shot in F.make_shots(50, seed=2):
        assert F.gpa(F.judge(F.corrupted_caption(shot, rng), shot)) <= 100.0
    metrics = F.caption_metrics([s.reference() for s in F.make_shots(5, 3)], F.make_shots(5, 3))
    assert metrics == {"gpa": 100.0, "whr": 0.0, "action_score": 100.0, "perfect_rate": 1.0}


def test_word_tokenizer_round_trips_captions():
    from posttrain.models.tokenizer import word_tokenizer

    tokenizer = word_tokenizer(F.vocabulary())
    for shot in F.make_shots(10, seed=4):
        for text in (shot.prompt(), shot.reference()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text
