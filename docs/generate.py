"""Rewrite the registry tables of the docs pages from the registries themselves, so they cannot go stale.

    python docs/generate.py           rewrite every table in docs/*.md in place
    python docs/generate.py --check   rewrite nothing; exit 1 naming each stale page

A table sits between two markers, `<!-- registry:<key> -->` and `<!-- /registry -->`, where <key> is a key of
`all_registries()` (`advantages`, `losses`, ...). Everything between the markers is generated: one row per
registered entry with its name, a summary, what it declares it `needs`, the keys of its `options` model and
what else it declares (model role, state, policy outputs, side module, tasks). Entries from plugins and
`module:attr` rewards (registry meta `source`) are left out: they belong to the user's environment.
The summary is the first paragraph of the entry's own docstring; an entry without one (most methods live one
per module, described by the module's docstring) gets the line of its module's docstring that starts with its
name (`name:` or `name` and two spaces, with the more indented lines below it), else the module docstring's first
paragraph. Every registry must have a table on some page; a marker naming no registry is an error.

The measured claims table sits between `<!-- claims -->` and `<!-- /claims -->` (docs/claims.md): one row per
claimed difference of every `experiments/results/<claim>.json` the claims harness wrote (experiments/_claims.py),
with each side's mean and 95% interval over the seeds, the paired difference, the verdict, and the command. The first
row of each claim carries the anchor `claim-<claim>`.

The table of the 30 seed methods sits between `<!-- methods -->` and `<!-- /methods -->` (docs/claims.md): one row per
method declared in experiments/_methods.py (anchor `method-<n>`), its claims, the model each was measured on, and how
many of its rows are decided: a verdict resting on at least 3 seeds whose premises held (all the seeds, where the claim
declares none); then the claims of the shared bases. README.md's index of the methods, linking each to its row, sits
between `<!-- method-index -->` and `<!-- /method-index -->`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
BLOCK = re.compile(r"(<!-- registry:(?P<key>[\w-]+) -->\n)(?P<body>.*?)(<!-- /registry -->)", re.DOTALL)
COMMAND = "python docs/generate.py"
CLAIMS = re.compile(r"(<!-- claims -->\n)(?P<body>.*?)(<!-- /claims -->)", re.DOTALL)
METHODS = re.compile(r"(<!-- methods -->\n)(?P<body>.*?)(<!-- /methods -->)", re.DOTALL)
METHOD_INDEX = re.compile(r"(<!-- method-index -->\n)(?P<body>.*?)(<!-- /method-index -->)", re.DOTALL)
DECIDED = ("reproduced", "contradicted", "inconclusive")  # the verdicts; the other rows say why they have none


def load_registries() -> dict:
    try:
        from posttrain.resolve import all_registries
    except ImportError:
        from posttrain.registry import all_registries
    return all_registries()


def first_paragraph(doc: str | None) -> str:
    paragraph = (doc or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def named_line(doc: str | None, name: str) -> str:
    """The line of `doc` that describes `name` (`name: ...` or `name  ...`), joined with its more indented continuation."""
    lines = (doc or "").splitlines()
    start = re.compile(rf"^(\s*)`?{re.escape(name)}`?(?::|\s{{2,}})\s*(\S.*)$")
    for i, line in enumerate(lines):
        match = start.match(line)
        if match:
            indent, parts = len(match[1]), [match[2]]
            for rest in lines[i + 1:]:
                if not rest.strip() or len(rest) - len(rest.lstrip()) <= indent:
                    break
                parts.append(rest.strip())
            return " ".join(parts)
    return ""


def summary(name: str, obj: object) -> str:
    own = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    module_doc = getattr(sys.modules.get(getattr(obj, "__module__", "")), "__doc__", None)
    text = first_paragraph(own) or named_line(module_doc, name) or first_paragraph(module_doc)
    return text.replace("|", "\\|") or "-"


def codes(items) -> str:
    return ", ".join(f"`{item}`" for item in items) or "-"


DECLARED = ("role", "state", "policy", "scores", "module", "tasks")  # what else a part declares to the trainer / resolve


def declared(meta: dict) -> str:
    shown = []
    for key in DECLARED:
        if key in meta:
            value = meta[key]
            value = getattr(value, "__name__", value)
            value = "+".join(value) if isinstance(value, tuple) else value
            shown.append(f"{key}: `{value}`" + (" (optional)" if key == "role" and meta.get("optional_role") else ""))
    return ", ".join(shown) or "-"


def render(registry) -> str:
    """The generated body of one registry's table (between the markers)."""
    lines = [
        f"_{registry.kind}: generated from the registry by `{COMMAND}`; do not edit between the markers._",
        "",
        "| name | summary | needs | options | declares |",
        "|---|---|---|---|---|",
    ]
    for entry in registry:
        if not str(entry.meta.get("source", "recipe")).startswith("recipe"):  # a plugin's or the user's own (`module:attr`)
            continue  # not this project's to document (posttrain's recipes load as plugins, and are)
        options = entry.meta.get("options")
        keys = list(options.model_fields) if options is not None else []
        needs = codes(entry.meta.get("needs", ()))
        lines.append(f"| `{entry.name}` | {summary(entry.name, entry.obj)} | {needs} | {codes(keys)} | {declared(entry.meta)} |")
    return "\n".join(lines) + "\n"


def rewrite(text: str, registries: dict, page: str) -> tuple[str, list[str], set[str]]:
    """(the page with every table regenerated, errors, the registry keys it has tables for)."""
    errors: list[str] = []
    found: set[str] = set()

    def table(match: re.Match) -> str:
        key = match["key"]
        if key not in registries:
            errors.append(f"{page}: marker registry:{key} names no registry (known: {', '.join(sorted(registries))})")
            return match[0]
        found.add(key)
        return match[1] + render(registries[key]) + match[4]

    return BLOCK.sub(table, text), errors, found


def interval(mean: float, ci: list[float]) -> str:
    low, high = (math.nan if v is None else v for v in ci)
    return f"{mean:.3f}" if math.isnan(low) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def premise_cell(c: dict, n: int) -> str:
    """Which seeds the row's verdict rests on: the seeds whose declared premises held (experiments/_premises.py)."""
    premise = c.get("premise") or {}
    if not premise.get("declared"):
        return f"{n} (none declared)"
    return f"{len(premise['held_seeds'])} of {n} held"


def render_claims(results: Path) -> str:
    """The claims table from the harness's JSON files in `results` (sorted by claim name), then each claim's premise
    failures (seed, premise, measured value)."""
    lines = ["| claim | metric | claimed | mean [95% CI] | vs | mean [95% CI] | difference [95% CI] | seeds (premise) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    commands, failures = [], []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        n = len(data["seeds"])
        for i, c in enumerate(data["comparisons"]):
            side = "<" if c["direction"] == "lower" else ">"
            anchor = f'<a id="claim-{path.stem}"></a>' if i == 0 else ""
            lines.append(f"| {anchor}`{path.stem}` | {c['metric']} | {c['better']} {side} {c['worse']} | {interval(c['better_mean'], c['better_ci'])} "
                         f"| {c['worse']} | {interval(c['worse_mean'], c['worse_ci'])} | {interval(c['diff_mean'], c['diff_ci'])} "
                         f"| {premise_cell(c, n)} | **{c['verdict']}** |")
        failed = sorted({f for c in data["comparisons"] for f in (c.get("premise") or {}).get("failures", [])})
        if failed:
            failures.append(f"- `{path.stem}`: " + "; ".join(failed))
        commands.append(f"- `{path.stem}`: `{data['command']}`")
    premise_lines = ["", '<a id="premise-failures"></a>Premises that failed (seed, premise, measured value; experiments/_premises.py):', "",
                     *failures] if failures else []
    return "\n".join(lines + premise_lines + ["", "Commands (each writes the JSON the rows above are generated from):", "", *commands]) + "\n"


def load_methods(root: Path):
    """experiments/_methods.py of the repository at `root` (loaded by path: experiments/ is no package), or None."""
    path = root / "experiments" / "_methods.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("experiments_methods", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def row_status(row: dict, n_seeds: int, min_seeds: int) -> str:
    """A claim row's verdict when it rests on at least `min_seeds` seeds whose premises held (all `n_seeds`, where the
    claim declares no premise); else why it has none: `premise failed`, `identical arms` or `under N seeds`."""
    verdict = row["verdict"]
    if verdict.startswith("premise failed"):
        return "premise failed"
    if verdict.startswith("too few seeds"):
        return f"under {min_seeds} seeds"
    if verdict not in DECIDED:
        return verdict  # identical arms
    premise = row.get("premise") or {}
    held = len(premise["held_seeds"]) if premise.get("declared") else n_seeds
    return verdict if held >= min_seeds else f"under {min_seeds} seeds"


def counted(statuses: list[str]) -> str:
    """'2 reproduced, 1 inconclusive': the statuses counted, verdicts first."""
    order = [*DECIDED, *sorted(set(statuses) - set(DECIDED))]
    return ", ".join(f"{statuses.count(s)} {s}" for s in order if s in statuses)


def claim_statuses(results: Path, measured, min_seeds: int) -> list[str] | None:
    """The statuses of the rows of `measured.claim` naming one of `measured.arms` (every row when it names none), less
    its construction checks (rows that hold by the setup's construction), or None when the claim has no results file."""
    path = results / f"{measured.claim}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    rows = [c for c in data["comparisons"] if (not measured.arms or c["better"] in measured.arms or c["worse"] in measured.arms)
            and not c.get("construction_check")]  # a check of the setup's construction is no evidence for the method
    return [row_status(c, len(data["seeds"]), min_seeds) for c in rows]


def decision(statuses: list[str], min_seeds: int) -> str:
    """A method's cell: how many of its rows are decided, with their verdicts, or why none is."""
    decided = [s for s in statuses if s in DECIDED]
    rest = [s for s in statuses if s not in DECIDED]
    if decided:
        return f"**{len(decided)} decided**: {counted(decided)}" + (f" (not decided: {counted(rest)})" if rest else "")
    if rest and set(rest) == {"premise failed"}:
        return f"**none decided**: premise failed on every row ({len(rest)} row{'s' * (len(rest) > 1)}; [failures](#premise-failures))"
    return f"**none decided**: {counted(rest)}" if rest else "**none decided**: no row"


def claims_cell(measured) -> str:
    rows = f" (rows naming {', '.join(f'`{a}`' for a in measured.arms)})" if measured.arms else ""
    return f"[`{measured.claim}`](#claim-{measured.claim}){rows}"


def models_cell(claims) -> str:
    models = [m.model for m in claims]
    return models[0] if len(set(models)) == 1 else "<br>".join(f"`{m.claim}`: {m.model}" for m in claims)


def render_methods(results: Path, methods) -> str:
    """The seed methods' table (`methods`: experiments/_methods.py) over the results in `results`, then the bases'."""
    min_seeds = methods.MIN_SEEDS
    lines = [f"| # | method | claims | measured on | rows decided on >= {min_seeds} seeds whose premises held |", "|---|---|---|---|---|"]
    for method in methods.METHODS:
        statuses, missing = [], []
        for measured in method.claims:
            found = claim_statuses(results, measured, min_seeds)
            statuses += found or []
            missing += [measured.claim] if found is None else []
        if not method.claims:
            cell = "**no harness claim**"
        else:
            cell = decision(statuses, min_seeds) + (f"; no results file: {', '.join(f'`{c}`' for c in missing)}" if missing else "")
        cell += f"; {method.note}" if method.note else ""
        claims = "<br>".join(claims_cell(m) for m in method.claims) or "-"
        models = models_cell(method.claims) if method.claims else "-"
        lines.append(f'| <a id="method-{method.number}"></a>{method.number} | [{method.name}]({method.doc}) | {claims} | {models} | {cell} |')
    lines += ["", "The shared bases (not seed methods):", "", "| claim | measures | measured on | rows decided |", "|---|---|---|---|"]
    for measured in methods.BASES:
        found = claim_statuses(results, measured, min_seeds)
        cell = "no results file" if found is None else decision(found, min_seeds)
        lines.append(f"| {claims_cell(measured)} | {measured.what} | {measured.model} | {cell} |")
    return "\n".join(lines) + "\n"


def render_method_index(methods, per_row: int = 3) -> str:
    """README's index: the methods `per_row` to a table row, each linking to its row in docs/claims.md."""
    cells = [f"{m.number} | [{m.name}](docs/claims.md#method-{m.number})" for m in methods.METHODS]
    lines = ["| " + " | ".join(["#", "method"] * per_row) + " |", "|" + "---|" * (2 * per_row)]
    for i in range(0, len(cells), per_row):
        row = cells[i:i + per_row]
        lines.append("| " + " | ".join(row + [" | "] * (per_row - len(row))) + " |")
    return "\n".join(lines) + "\n"


def pages(docs: Path = DOCS) -> list[Path]:
    """Every docs page, and the README beside docs/ (its index of the methods is generated too)."""
    readme = docs.parent / "README.md"
    return sorted(docs.glob("*.md")) + ([readme] if readme.is_file() else [])


def update(write: bool, docs: Path = DOCS, registries: dict | None = None, methods=None) -> list[str]:
    """Regenerate every table (written back when `write`); returns the problems, one line each. `methods`: the module
    declaring the seed methods (default: experiments/_methods.py beside `docs`)."""
    registries = load_registries() if registries is None else registries
    methods = load_methods(docs.parent) if methods is None else methods
    results = docs.parent / "experiments" / "results"
    problems: list[str] = []
    covered: set[str] = set()
    for path in pages(docs):
        old = path.read_text()
        new, errors, found = rewrite(old, registries, str(path.relative_to(docs.parent)))
        new = CLAIMS.sub(lambda m: m[1] + render_claims(results) + m[3], new)
        if methods is None and (METHODS.search(new) or METHOD_INDEX.search(new)):
            errors.append(f"{path.relative_to(docs.parent)}: a methods table, but no experiments/_methods.py")
        elif methods is not None:
            new = METHODS.sub(lambda m: m[1] + render_methods(results, methods) + m[3], new)
            new = METHOD_INDEX.sub(lambda m: m[1] + render_method_index(methods) + m[3], new)
        problems += errors
        covered |= found
        if new != old:
            if write:
                path.write_text(new)
            else:
                problems.append(f"{path.relative_to(docs.parent)} is stale: its registry tables differ from the registries"
                                + (" or its claims table from experiments/results/" if CLAIMS.search(old) else "")
                                + (" or its methods table from experiments/_methods.py" if METHODS.search(old) or METHOD_INDEX.search(old) else ""))
    for key in sorted(set(registries) - covered):
        problems.append(f"registry {key!r} has no table: add `<!-- registry:{key} -->` ... `<!-- /registry -->` to a page in docs/")
    return problems


def check(docs: Path = DOCS) -> list[str]:
    """The problems `--check` reports (empty when every table is current)."""
    return update(write=False, docs=docs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    problems = update(write=not args.check)
    for line in problems:
        print(line, file=sys.stderr)
    if problems and args.check:
        print(f"run `{COMMAND}` to regenerate the tables", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
