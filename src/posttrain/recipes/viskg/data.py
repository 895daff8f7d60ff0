"""VisKG's synthetic visual question answering set (specs §29): rendered scenes of coloured shapes on a grid, with
questions that need one to `max_hops` spatial relations, and the targets a model learns to write.

A scene puts `n_objects` objects, each a distinct (colour, shape), in distinct cells of a `grid` x `grid` board and
renders it as an RGB image (`cell` pixels a cell). Relations hold between grid neighbours: X `left_of` Y when X is in
the cell directly left of Y (likewise `right_of`, `above`, `below`), so "the object left_of Y" names at most one
object. A question of h hops starts at a named object X0 and follows h relations,

    what color is the object right_of the object above the red square ?      (h = 2: X1 above X0, X2 right_of X1)

and its answer is an attribute (colour or shape) of the last object. The targets, one word-level token each word:

    <kg> ( X1 , above , X0 ) ; ( X2 , right_of , X1 ) </kg>            question-specific knowledge graph: only the path
    <caption> ( X , at , row0 col1 ) ; ... ( X , left_of , Y ) ; ... </caption>   the full-caption representation:
                                                                      every object's cell and every neighbour pair
    <think> the object above X0 is X1 . the object right_of X1 is X2 . its color is blue . </think> <answer> blue </answer>

A negative-rationale sample (VisKG's SFT) writes a wrong chain marked as such, says why it is wrong, then the correct
chain, and always ends with the correct answer: the model is never taught to output a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLORS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240), "yellow": (240, 220, 40)}
SHAPES = ("square", "circle", "triangle")
RELATIONS = {"left_of": (0, -1), "right_of": (0, 1), "above": (-1, 0), "below": (1, 0)}  # X rel Y: X's cell = Y's + offset
CANONICAL = ("left_of", "above")  # the caption lists each neighbour pair once
TAGS = {"kg": ("<kg>", "</kg>"), "caption": ("<caption>", "</caption>")}
MAX_GRID = 6
FILLER = ("what", "is", "the", "object", "of", "its", "color", "shape", "at", "so", ".", ",", ";", "(", ")", "?", "incorrect",
          "reasoning", ":", "this", "wrong", "because", "not", "correct", "<think>", "</think>", "<answer>", "</answer>")


def vocabulary() -> list[str]:
    """Every word a question or target can hold (a closed word-level vocabulary)."""
    cells = [f"row{i}" for i in range(MAX_GRID)] + [f"col{i}" for i in range(MAX_GRID)]
    return [*FILLER, *COLORS, *SHAPES, *RELATIONS, *cells, *[t for pair in TAGS.values() for t in pair]]


@dataclass(frozen=True)
class Obj:
    color: str
    shape: str
    row: int
    col: int

    @property
    def name(self) -> str:
        return f"{self.color} {self.shape}"


@dataclass(frozen=True)
class Question:
    objects: tuple[Obj, ...]  # the scene
    path: tuple[int, ...]  # object indices X0 .. Xh
    relations: tuple[str, ...]  # r1 .. rh: X_i r_i X_{i-1}
    attribute: str  # "color" | "shape"
    grid: int

    @property
    def hops(self) -> int:
        return len(self.relations)

    @property
    def answer(self) -> str:
        last = self.objects[self.path[-1]]
        return last.color if self.attribute == "color" else last.shape

    @property
    def text(self) -> str:
        chain = " ".join(f"the object {r}" for r in reversed(self.relations))
        return f"what {self.attribute} is {chain} the {self.objects[self.path[0]].name} ?"


def neighbour(objects: tuple[Obj, ...], index: int, relation: str) -> int | None:
    """The object that stands in `relation` to object `index` (X with X relation Y=index), or None."""
    dr, dc = RELATIONS[relation]
    y = objects[index]
    return next((i for i, x in enumerate(objects) if (x.row, x.col) == (y.row + dr, y.col + dc)), None)


def random_scene(rng: np.random.Generator, grid: int, n_objects: int) -> tuple[Obj, ...]:
    kinds = [(c, s) for c in COLORS for s in SHAPES]
    chosen = rng.choice(len(kinds), size=n_objects, replace=False)
    cells = rng.choice(grid * grid, size=n_objects, replace=False)
    return tuple(Obj(*kinds[k], int(c) // grid, int(c) % grid) for k, c in zip(chosen, cells))


def paths(objects: tuple[Obj, ...], hops: int) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    """Every relation chain of `hops` steps that visits no object twice."""
    found = [((i,), ()) for i in range(len(objects))]
    for _ in range(hops):
        found = [(p + (j,), rs + (r,)) for p, rs in found for r in RELATIONS
                 if (j := neighbour(objects, p[-1], r)) is not None and j not in p]
    return found


def make_question(rng: np.random.Generator, grid: int, n_objects: int, max_hops: int) -> Question:
    """A question of 1..max_hops hops (uniform) on a fresh scene (scenes without such a chain are redrawn)."""
    hops = int(rng.integers(1, max_hops + 1))
    while True:
        objects = random_scene(rng, grid, n_objects)
        found = paths(objects, hops)
        if found:
            path, relations = found[int(rng.integers(len(found)))]
            return Question(objects, path, relations, ("color", "shape")[int(rng.integers(2))], grid)


def questions(seed: int, n: int, grid: int, n_objects: int, max_hops: int, split: int = 0) -> list[Question]:
    """`n` questions drawn from (seed, split): split 0 trains, 1 is held out."""
    rng = np.random.default_rng([seed, 29, split])
    return [make_question(rng, grid, n_objects, max_hops) for _ in range(n)]


# -- targets ---------------------------------------------------------------------------------------------------
def triple(head: str, relation: str, tail: str) -> str:
    return f"( {head} , {relation} , {tail} )"


def knowledge_graph(q: Question) -> str:
    """The question-specific graph: the triples of the path, nothing else (minimum sufficient information)."""
    names = [q.objects[i].name for i in q.path]
    body = " ; ".join(triple(names[i + 1], r, names[i]) for i, r in enumerate(q.relations))
    return f"<kg> {body} </kg>"


def caption(q: Question) -> str:
    """The full-caption representation: every object's cell, then every neighbour pair (once, canonical relation)."""
    objs = q.objects
    cells = [triple(o.name, "at", f"row{o.row} col{o.col}") for o in objs]
    pairs = [triple(objs[j].name, r, objs[i].name) for i in range(len(objs)) for r in CANONICAL if (j := neighbour(objs, i, r)) is not None]
    return f"<caption> {' ; '.join(cells + pairs)} </caption>"


def chain_text(relations, names: list[str], attribute: str, answer: str) -> str:
    steps = " ".join(f"the object {r} {names[i]} is {names[i + 1]} ." for i, r in enumerate(relations))
    return f"{steps} its {attribute} is {answer} ."


def representation(q: Question, kind: str) -> str:
    return knowledge_graph(q) if kind == "kg" else caption(q)


def target(q: Question, kind: str) -> str:
    """The positive completion: representation, reasoning over it, answer."""
    names = [q.objects[i].name for i in q.path]
    return f"{representation(q, kind)} <think> {chain_text(q.relations, names, q.attribute, q.answer)} </think> <answer> {q.answer} </answer>"


def negative_target(q: Question, kind: str, rng: np.random.Generator) -> str:
    """A negative-rationale completion: a wrong chain (the correct one up to a hop whose object is swapped for
    another object of the scene, concluding from it), labelled incorrect, the reason, then the correct chain and the
    correct answer (always the answer block's only word)."""
    names = [q.objects[i].name for i in q.path]
    hop = int(rng.integers(1, len(names)))  # the step of the chain that goes wrong
    others = [o for i, o in enumerate(q.objects) if i not in q.path[:hop + 1]] or [o for i, o in enumerate(q.objects) if i != q.path[hop]]
    wrong_obj = others[int(rng.integers(len(others)))]
    wrong_answer = wrong_obj.color if q.attribute == "color" else wrong_obj.shape
    why = f"the object {q.relations[hop - 1]} {names[hop - 1]} is {names[hop]} , not {wrong_obj.name} ."
    think = (f"incorrect reasoning : {chain_text(q.relations[:hop], names[:hop] + [wrong_obj.name], q.attribute, wrong_answer)} "
             f"this is wrong because {why} correct reasoning : {chain_text(q.relations, names, q.attribute, q.answer)}")
    return f"{representation(q, kind)} <think> {think} </think> <answer> {q.answer} </answer>"


def sft_examples(qs: list[Question], kind: str, negatives_per_positive: float, seed: int) -> list[tuple[int, str]]:
    """(question index, completion) pairs: every question's positive, and a negative-rationale sample for a
    `negatives_per_positive` share of them (specs §29: 1:3)."""
    rng = np.random.default_rng([seed, 29, 7])
    out = [(i, target(q, kind)) for i, q in enumerate(qs)]
    n_neg = int(round(negatives_per_positive * len(qs)))
    for i in sorted(rng.choice(len(qs), size=n_neg, replace=False).tolist()):
        out.append((i, negative_target(qs[i], kind, rng)))
    return out


# -- rendering -------------------------------------------------------------------------------------------------
def render(q: Question, cell: int) -> np.ndarray:
    """The scene as uint8 [grid*cell, grid*cell, 3]: a dark board, each object filling its cell less a margin."""
    size = q.grid * cell
    image = np.full((size, size, 3), 24, dtype=np.uint8)
    yy, xx = np.mgrid[0:cell, 0:cell] + 0.5
    centre, radius = cell / 2, cell / 2 - 1
    masks = {
        "square": (np.abs(yy - centre) <= radius - 0.5) & (np.abs(xx - centre) <= radius - 0.5),
        "circle": (yy - centre) ** 2 + (xx - centre) ** 2 <= radius ** 2,
        "triangle": (yy >= 1) & (yy <= cell - 1) & (np.abs(xx - centre) <= (yy - 1) / 2),
    }
    for o in q.objects:
        patch = image[o.row * cell:(o.row + 1) * cell, o.col * cell:(o.col + 1) * cell]
        patch[masks[o.shape]] = COLORS[o.color]
    return image


def render_all(qs: list[Question], cell: int) -> np.ndarray:
    return np.stack([render(q, cell) for q in qs])
