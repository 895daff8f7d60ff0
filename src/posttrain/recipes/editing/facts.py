"""A synthetic fact set for lifelong knowledge editing (GLIME, 2026): subjects x relations -> objects, each
relation asked through several paraphrase templates, and a stream of edits that give chosen facts new objects.

    prompt      "kavom speaks:"              (template "{s} speaks", then ":")
    completion  "dutch"                      (the object, ended by EOS)

Each relation has five templates with fixed roles: template 0 is the edit prompt p_e (what an edit trains on),
templates 1-2 are training paraphrases (the prompts p' of GLIME's generation-preference term), templates 3-4 are
held-out paraphrases, read only to measure generalisation. The base model learns every fact under every template
(as a pretrained LM knows a fact in many phrasings); "held out" means held out from editing. The facts split into
`edited` (the N facts of the edit stream) and `unedited` (locality probes), disjoint.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.recipes.editing.settings import FactsConfig
from posttrain.data.files import json_lines
from posttrain.errors import UserError
from posttrain.tasks import Example

# relation -> (objects, templates); template roles by index: 0 edit prompt, 1-2 training paraphrases, 3-4 held out
RELATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lives_in": (("oslo", "lima", "rome", "cairo", "dakar", "quito", "perth", "hanoi"),
                 ("{s} lives in", "{s} resides in", "the home of {s} is", "{s} is a resident of", "{s} has a house in")),
    "color": (("red", "blue", "green", "black", "white", "pink", "gray", "brown"),
              ("{s} likes the color", "the favorite color of {s} is", "{s} prefers the color", "{s} loves the color",
               "the color {s} likes best is")),
    "sport": (("golf", "chess", "polo", "tennis", "rugby", "judo", "darts", "squash"),
              ("{s} plays", "the sport of {s} is", "{s} is good at", "{s} practices", "the game {s} plays is")),
    "language": (("greek", "hindi", "dutch", "czech", "thai", "swahili", "malay", "welsh"),
                 ("{s} speaks", "the language of {s} is", "{s} talks in", "{s} is fluent in", "the tongue of {s} is")),
    "job": (("baker", "pilot", "nurse", "judge", "farmer", "tailor", "miner", "poet"),
            ("{s} works as a", "the job of {s} is", "{s} is employed as a", "{s} earns a living as a", "by trade {s} is a")),
}
ROLES = {"edit": (0,), "paraphrase": (1, 2), "heldout": (3, 4)}
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
assert all(len(objs) == 8 and len(templates) == 5 for objs, templates in RELATIONS.values())  # FactsConfig bounds


@dataclass(frozen=True)
class Edit:
    subject: str
    relation: str
    old: str  # the object the base model knows
    new: str  # the object the edit asserts


@dataclass(frozen=True)
class FactSet:
    objects: dict[str, tuple[str, ...]]  # relation -> its object vocabulary
    facts: dict[tuple[str, str], str]  # (subject, relation) -> object

    def prompt(self, subject: str, relation: str, template: int) -> str:
        return RELATIONS[relation][1][template].format(s=subject) + ":"

    def prompts(self, subject: str, relation: str, role: str) -> list[str]:
        return [self.prompt(subject, relation, t) for t in ROLES[role]]

    def all_prompts(self, subject: str, relation: str) -> list[str]:
        return [self.prompt(subject, relation, t) for t in range(len(RELATIONS[relation][1]))]

    def pretraining_examples(self) -> list[Example]:
        """Every fact under every template: what the base model learns."""
        return [Example(p, obj, obj) for (s, r), obj in self.facts.items() for p in self.all_prompts(s, r)]

    def alphabet(self) -> str:
        texts = [t for _, templates in RELATIONS.values() for t in templates] + [s for s, _ in self.facts]
        texts += [o for objs in self.objects.values() for o in objs]
        return "".join(sorted(set("".join(texts).replace("{s}", "") + ":")))

    def to_json(self) -> str:
        return json.dumps({"objects": self.objects, "facts": [[s, r, o] for (s, r), o in self.facts.items()]})

    @classmethod
    def from_json(cls, text: str) -> "FactSet":
        raw = json.loads(text)
        return cls({r: tuple(objs) for r, objs in raw["objects"].items()}, {(s, r): o for s, r, o in raw["facts"]})


def build_fact_set(opts: FactsConfig) -> FactSet:
    rng = random.Random(opts.seed)
    names: set[str] = set()
    while len(names) < opts.n_subjects:  # consonant-vowel-consonant-vowel-consonant names, e.g. "kavom"
        names.add("".join(rng.choice(_CONSONANTS if i % 2 == 0 else _VOWELS) for i in range(5)))
    relations = list(RELATIONS)[: opts.relations]
    objects = {r: RELATIONS[r][0][: opts.objects_per_relation] for r in relations}
    facts = {(s, r): rng.choice(objects[r]) for s in sorted(names) for r in relations}
    return FactSet(objects, facts)


def edit_stream(facts: FactSet, n: int, seed: int) -> list[Edit]:
    """`n` edits of distinct facts, each to an object other than the current one, in a seeded order."""
    if n >= len(facts.facts):
        raise UserError(f"edit.n_edits = {n} must be below the {len(facts.facts)} facts (some must stay unedited for locality)")
    rng = random.Random(seed)
    chosen = rng.sample(sorted(facts.facts), n)
    return [Edit(s, r, facts.facts[s, r], rng.choice([o for o in facts.objects[r] if o != facts.facts[s, r]])) for s, r in chosen]


def split_facts(facts: FactSet, edits: Sequence[Edit]) -> dict[str, list[tuple[str, str]]]:
    edited = [(e.subject, e.relation) for e in edits]
    return {"edited": edited, "unedited": [key for key in facts.facts if key not in set(edited)]}


_EDIT_FIELDS = {"subject", "relation", "new"}  # plus an optional "old", checked against the fact set


def read_edits(path: Path, facts: FactSet) -> list[Edit]:
    """A JSON-lines edit stream, `{"subject", "relation", "new"[, "old"]}` per line, checked against the fact set;
    a bad line is a `UserError` naming file and line."""
    edits: list[Edit] = []
    seen: set[tuple[str, str]] = set()
    alphabet = set(facts.alphabet())
    for where, record in json_lines(path, "edit"):
        if not isinstance(record, dict) or set(record) - {"old"} != _EDIT_FIELDS or not all(isinstance(v, str) for v in record.values()):
            raise UserError(f"{where}: expected an object with string fields {sorted(_EDIT_FIELDS)} (and optionally 'old')")
        key = (record["subject"], record["relation"])
        if record["relation"] not in facts.objects:
            raise UserError(f"{where}: unknown relation {record['relation']!r}; the fact set has {', '.join(facts.objects)}")
        if key not in facts.facts:
            raise UserError(f"{where}: no fact ({record['subject']!r}, {record['relation']!r}) in the fact set")
        if key in seen:
            raise UserError(f"{where}: fact ({record['subject']!r}, {record['relation']!r}) is edited twice")
        new, old = record["new"], facts.facts[key]
        if not new or not set(new) <= alphabet:
            raise UserError(f"{where}: new object {new!r} is empty or has characters outside the fact set's alphabet")
        if record.get("old", old) != old:
            raise UserError(f"{where}: old object {record['old']!r} disagrees with the fact set ({old!r})")
        if new == old:
            raise UserError(f"{where}: new object {new!r} is what the fact already says")
        seen.add(key)
        edits.append(Edit(*key, old, new))
    if not edits:
        raise UserError(f"{path}: no edits")
    if len(edits) >= len(facts.facts):
        raise UserError(f"{path}: {len(edits)} edits leave no unedited fact for locality")
    return edits


def write_edits(path: Path, edits: Sequence[Edit]) -> None:
    with path.open("w") as f:
        for e in edits:
            f.write(json.dumps(asdict(e)) + "\n")
