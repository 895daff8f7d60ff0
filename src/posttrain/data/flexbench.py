"""A FlexBench-like synthetic captioning benchmark and its GPA score (FlexBench and GM-DPO, 2026; derived from the abstract).

A *shot* lists 1-2 persons, each with a substantive action, the limb doing it and a body state. Its prompt is
a terse structured record (the stand-in for the video); a caption describes the shot in words, one clause
per person: `<person> [<state>] <action> [<side> <limb>] .`. The reference checklist has one item per
person and slot with a severity: action 3 (substantive), limb 2, state 1. The judge labels each item
correct / missing / incorrect and counts fabricated assertions (clauses about a person not in the shot, or a
second clause about the same person), each asserted slot weighted by its severity:

    GPA(c) = 100 * [ sum_q s(q) 1[correct] - lambda_err sum_q s(q) 1[incorrect] - lambda_fab sum_f s(f) ] / sum_q s(q)
             clipped below at -100
    WHR(c) = [ sum_q s(q) 1[incorrect] + sum_f s(f) ] / [ severity of every assertion made ]   (0 if none made)
    substantive-action score = GPA over the action items only

Invariants: a perfect caption scores 100; omitting an item scores at least as much as asserting it wrongly;
a fabricated action strictly lowers GPA.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from posttrain.data.preferences import PreferencePair

PERSONS = ("p1", "p2", "p3", "p4")
ACTIONS = ("raises", "lowers", "waves", "kicks", "points", "swings")
LIMBS = ("left arm", "right arm", "left leg", "right leg")
STATES = ("standing", "sitting", "kneeling", "walking")
SEVERITY = {"action": 3, "limb": 2, "state": 1}
# the structured record's words (the "video"), deliberately different from the caption's words
_CODE = {**{a: f"a_{a[:4]}" for a in ACTIONS}, **{limb: "l_" + "".join(w[0] for w in limb.split()) for limb in LIMBS},
         **{s: f"s_{s[:4]}" for s in STATES}}


@dataclass(frozen=True)
class Actor:
    person: str
    action: str
    limb: str
    state: str


@dataclass(frozen=True)
class Shot:
    actors: tuple[Actor, ...]

    def prompt(self) -> str:
        return "shot " + " ".join(f"{a.person} {_CODE[a.state]} {_CODE[a.action]} {_CODE[a.limb]}" for a in self.actors) + " caption"

    def reference(self) -> str:
        return " ".join(clause(a.person, a.state, a.action, a.limb) for a in self.actors)


def clause(person: str, state: str | None, action: str, limb: str | None) -> str:
    return " ".join(w for w in (person, state, action, limb) if w) + " ."


def vocabulary() -> list[str]:
    words = {"shot", "caption", ".", *PERSONS, *ACTIONS, *STATES, *_CODE.values()}
    words |= {w for limb in LIMBS for w in limb.split()}
    return sorted(words)


def make_shots(n: int, seed: int) -> list[Shot]:
    rng = random.Random(seed)
    shots = []
    for _ in range(n):
        people = rng.sample(PERSONS[:3], rng.choice((1, 2)))
        shots.append(Shot(tuple(Actor(p, rng.choice(ACTIONS), rng.choice(LIMBS), rng.choice(STATES)) for p in sorted(people))))
    return shots


def parse_caption(caption: str) -> list[dict[str, str]]:
    """Each well-formed clause as {person, action[, limb][, state]}; malformed clauses assert nothing."""
    found = []
    for part in caption.split("."):
        words = part.split()
        if not words or words[0] not in PERSONS:
            continue
        slots, rest = {"person": words[0]}, words[1:]
        if rest and rest[0] in STATES:
            slots["state"], rest = rest[0], rest[1:]
        if not rest or rest[0] not in ACTIONS:
            continue
        slots["action"], rest = rest[0], rest[1:]
        if len(rest) == 2 and " ".join(rest) in LIMBS:
            slots["limb"] = " ".join(rest)
        elif rest:
            continue
        found.append(slots)
    return found


@dataclass(frozen=True)
class Judgement:
    correct: float  # severity-weighted sums
    incorrect: float
    missing: float
    fabricated: float
    total: float  # sum of the checklist's severities
    action_correct: float
    action_incorrect: float
    action_total: float


def judge(caption: str, shot: Shot) -> Judgement:
    clauses = parse_caption(caption)
    by_person: dict[str, dict[str, str]] = {}
    fabricated = 0.0
    for slots in clauses:
        known = any(a.person == slots["person"] for a in shot.actors)
        if not known or slots["person"] in by_person:  # an unseen person, or a second story about the same one
            fabricated += sum(SEVERITY[k] for k in slots if k != "person")
        else:
            by_person[slots["person"]] = slots
    sums = {"correct": 0.0, "incorrect": 0.0, "missing": 0.0}
    action = {"correct": 0.0, "incorrect": 0.0}
    for actor in shot.actors:
        said = by_person.get(actor.person, {})
        for slot, severity in SEVERITY.items():
            label = "missing" if slot not in said else ("correct" if said[slot] == getattr(actor, slot) else "incorrect")
            sums[label] += severity
            if slot == "action" and label != "missing":
                action[label] += severity
    total = float(sum(SEVERITY.values()) * len(shot.actors))
    return Judgement(sums["correct"], sums["incorrect"], sums["missing"], fabricated, total, action["correct"], action["incorrect"], 3.0 * len(shot.actors))


def gpa(j: Judgement, lambda_err: float = 1.0, lambda_fab: float = 1.0) -> float:
    return max(-100.0, 100.0 * (j.correct - lambda_err * j.incorrect - lambda_fab * j.fabricated) / j.total)


def weighted_hallucination_rate(j: Judgement) -> float:
    asserted = j.correct + j.incorrect + j.fabricated
    return (j.incorrect + j.fabricated) / asserted if asserted else 0.0


def substantive_action_score(j: Judgement) -> float:
    return 100.0 * (j.action_correct - j.action_incorrect) / j.action_total


def corrupted_caption(shot: Shot, rng: random.Random) -> str:
    """The reference caption with one or two edits: omit a slot or a person, assert a wrong value, or fabricate."""
    slots = [{"person": a.person, "state": a.state, "action": a.action, "limb": a.limb} for a in shot.actors]
    extra = []
    for _ in range(rng.choice((1, 2))):
        kind = rng.choice(("omit", "omit", "wrong", "wrong", "fabricate"))
        target = rng.choice(slots)
        if kind == "omit":
            key = rng.choice(("state", "limb", "person"))
            if key == "person" and len(slots) > 1:
                slots.remove(target)
            elif key != "person":
                target[key] = None
        elif kind == "wrong":
            key = rng.choice(("state", "action", "limb"))
            pool = {"state": STATES, "action": ACTIONS, "limb": LIMBS}[key]
            target[key] = rng.choice([v for v in pool if v != target[key]])
        else:
            absent = [p for p in PERSONS if all(a.person != p for a in shot.actors)]
            extra.append(clause(rng.choice(absent), None, rng.choice(ACTIONS), rng.choice(LIMBS)))
    text = " ".join(clause(s["person"], s["state"], s["action"], s["limb"]) for s in slots)
    return " ".join([text, *extra]).strip()


def shot_pairs(shots: list[Shot], per_shot: int, seed: int) -> list[PreferencePair]:
    """Pairs of captions of the same shot with different GPA: chosen = higher GPA; severity = min(1, gap / 100)."""
    rng = random.Random(seed)
    pairs = []
    for shot in shots:
        captions = [shot.reference()] + [corrupted_caption(shot, rng) for _ in range(2 * per_shot)]
        scored = [(gpa(judge(c, shot)), c) for c in dict.fromkeys(captions)]
        made = 0
        for _ in range(8 * per_shot):
            (s1, c1), (s2, c2) = rng.sample(scored, 2) if len(scored) > 1 else (scored[0], scored[0])
            if s1 == s2:
                continue
            (sw, cw), (sl, cl) = ((s1, c1), (s2, c2)) if s1 > s2 else ((s2, c2), (s1, c1))
            pairs.append(PreferencePair(shot.prompt(), cw, cl, round(min(1.0, (sw - sl) / 100.0), 6), None))
            made += 1
            if made == per_shot:
                break
    return pairs


def caption_metrics(captions: list[str], shots: list[Shot]) -> dict[str, float]:
    """Mean GPA, weighted hallucination rate, substantive-action score and perfect-caption rate."""
    judged = [judge(c, s) for c, s in zip(captions, shots)]
    n = max(len(judged), 1)
    return {
        "gpa": sum(map(gpa, judged)) / n,
        "whr": sum(map(weighted_hallucination_rate, judged)) / n,
        "action_score": sum(map(substantive_action_score, judged)) / n,
        "perfect_rate": sum(gpa(j) == 100.0 for j in judged) / n,
    }
