"""Grade-school word problems with numeric answers, as a user's own dataset would come: JSON lines with a
question, a worked solution and the numeric answer, plus columns a reward may read.

    python examples/word_problems/generate.py --out examples/word_problems/data --n-train 3000 --n-heldout 300

Each problem is one of a few templates (one- or two-step addition, subtraction, multiplication, sharing),
filled with seeded names, objects and small numbers (sums below 50, times tables to 9 x 9: sized for a
tiny model; widen the ranges for a real one); the answer is computed, never written by hand, and the same
question never appears twice or in both files. Columns: `question`, `solution` ("... so the answer is 12."),
`answer` ("12"), `kind` (the template) and `steps` (1 or 2): metadata a reward or an analysis can use. With
`--answer-format "#### {answer}"` each row also has `worked`: the solution ending in the answer written that way
("5 + 7 = 12 apples #### 12"), an SFT completion in the format a reward's answer pattern reads.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ["Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia", "Omar", "Pia"]
THINGS = ["apples", "books", "coins", "shells", "stamps", "marbles", "pencils", "cards"]

Problem = tuple[str, str, int, int]  # question, solution, answer, steps


def _more(r: random.Random) -> Problem:
    name, thing, a, b = r.choice(NAMES), r.choice(THINGS), r.randint(2, 30), r.randint(2, 20)
    return (f"{name} has {a} {thing} and finds {b} more. How many {thing} does {name} have now?",
            f"{name} has {a} + {b} = {a + b} {thing}, so the answer is {a + b}.", a + b, 1)


def _less(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a = r.randint(5, 40)
    b = r.randint(1, a - 1)
    return (f"{name} had {a} {thing} and gave away {b}. How many {thing} are left?",
            f"{a} - {b} = {a - b} {thing} are left, so the answer is {a - b}.", a - b, 1)


def _times(r: random.Random) -> Problem:
    name, thing, boxes, each = r.choice(NAMES), r.choice(THINGS), r.randint(2, 9), r.randint(2, 9)
    return (f"{name} has {boxes} boxes with {each} {thing} in each box. How many {thing} are there in all?",
            f"{boxes} x {each} = {boxes * each} {thing}, so the answer is {boxes * each}.", boxes * each, 1)


def _share(r: random.Random) -> Problem:
    name, thing, friends, each = r.choice(NAMES), r.choice(THINGS), r.randint(2, 9), r.randint(2, 9)
    total = friends * each
    return (f"{name} shares {total} {thing} equally among {friends} friends. How many {thing} does each friend get?",
            f"{total} / {friends} = {each} {thing} each, so the answer is {each}.", each, 1)


def _more_then_less(r: random.Random) -> Problem:
    name, thing, a, b = r.choice(NAMES), r.choice(THINGS), r.randint(5, 20), r.randint(2, 10)
    c = r.randint(1, a + b - 1)
    return (f"{name} has {a} {thing}, buys {b} more, then loses {c}. How many {thing} does {name} have?",
            f"{a} + {b} = {a + b}, and {a + b} - {c} = {a + b - c}, so the answer is {a + b - c}.", a + b - c, 2)


def _times_then_more(r: random.Random) -> Problem:
    name, thing, boxes, each, extra = r.choice(NAMES), r.choice(THINGS), r.randint(2, 5), r.randint(2, 5), r.randint(1, 10)
    total = boxes * each + extra
    return (f"{name} has {boxes} bags of {each} {thing} and {extra} loose {thing}. How many {thing} are there?",
            f"{boxes} x {each} = {boxes * each}, and {boxes * each} + {extra} = {total}, so the answer is {total}.", total, 2)


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "more": _more, "less": _less, "times": _times, "share": _share,
    "more_then_less": _more_then_less, "times_then_more": _times_then_more,
}


def generate(n_train: int, n_heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """`n_train` + `n_heldout` distinct problems, drawn round-robin over the templates from `random.Random(seed)`."""
    r = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict] = []
    kinds = sorted(TEMPLATES)
    attempts = 0
    while len(rows) < n_train + n_heldout:
        attempts += 1
        if attempts > 50 * (n_train + n_heldout):
            raise SystemExit(f"only {len(rows)} distinct problems found; ask for fewer")
        kind = kinds[len(rows) % len(kinds)]
        question, solution, answer, steps = TEMPLATES[kind](r)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "solution": solution, "answer": str(answer), "kind": kind, "steps": steps})
    r.shuffle(rows)
    return rows[:n_train], rows[n_train:]


def worked(row: dict, answer_format: str) -> str:
    """The row's solution with its closing words ", so the answer is N." replaced by the answer in `answer_format`."""
    closing = f", so the answer is {row['answer']}."
    if not row["solution"].endswith(closing):
        raise SystemExit(f"unexpected solution form: {row['solution']!r}")
    return row["solution"].removesuffix(closing) + " " + answer_format.replace("{answer}", row["answer"])


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--n-heldout", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-format", default=None, help='add a `worked` column ending in the answer written this way, e.g. "#### {answer}"')
    args = parser.parse_args()
    if args.answer_format is not None and "{answer}" not in args.answer_format:
        raise SystemExit(f"--answer-format must contain {{answer}}: {args.answer_format!r}")
    train, heldout = generate(args.n_train, args.n_heldout, args.seed)
    if args.answer_format is not None:
        train, heldout = ([{**row, "worked": worked(row, args.answer_format)} for row in rows] for rows in (train, heldout))
    write(args.out / "train.jsonl", train)
    write(args.out / "heldout.jsonl", heldout)
    print(f"{len(train)} train and {len(heldout)} held-out problems in {args.out}")


if __name__ == "__main__":
    main()
