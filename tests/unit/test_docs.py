"""The docs: registry tables generated from the registries and current, no unresolvable references, no dead links."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registry_tables_are_current():
    problems = load_generator().check()
    assert not problems, "\n".join([*problems, "run `python docs/generate.py` to regenerate the tables"])


def test_check_names_a_stale_page(tmp_path):
    generate = load_generator()
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("# page\n\n<!-- registry:tasks -->\nold\n<!-- /registry -->\n")
    registries = {"tasks": generate.load_registries()["tasks"]}
    assert generate.update(write=False, docs=page.parent, registries=registries) == [
        "docs/page.md is stale: its registry tables differ from the registries"
    ]
    assert generate.update(write=True, docs=page.parent, registries=registries) == []
    assert "| `arithmetic` |" in page.read_text()
    assert generate.update(write=False, docs=page.parent, registries=registries) == []


def test_every_registry_has_a_table_and_every_marker_a_registry(tmp_path):
    generate = load_generator()
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("<!-- registry:nosuch -->\n<!-- /registry -->\n")
    problems = generate.update(write=False, docs=page.parent, registries={"tasks": generate.load_registries()["tasks"]})
    assert any("registry:nosuch names no registry" in p for p in problems)
    assert any("registry 'tasks' has no table" in p for p in problems)


def test_no_page_cites_the_unpublished_spec():
    files = [REPO / "README.md", *(p for p in DOCS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)]
    offenders = [str(p.relative_to(REPO)) for p in files if "spec §".encode() in p.read_bytes()]
    assert not offenders, f"'spec §' cites a reference readers cannot open: {offenders}"


def test_relative_links_point_to_existing_files():
    dead = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            if not (page.parent / target.split("#")[0]).exists():
                dead.append(f"{page.relative_to(REPO)} -> {target}")
    assert not dead, f"dead relative links: {dead}"


TICKED = re.compile(r"`([^`\n]+)`")
PATH_LIKE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*/(?:[A-Za-z0-9_.-]*\.[A-Za-z0-9]+)?$")  # a/b.ext or a/b/
# a backticked path is read from the repository root, or from src/posttrain/ as the docs name modules (`trainers/rl.py`)
ROOTS = (REPO, REPO / "src" / "posttrain")


def named_repo_paths(text: str) -> list[str]:
    """The backticked spans of `text` (outside code blocks) that name a file or folder of this repository: shaped
    like a path (a '/' and an extension, or a trailing '/') and starting with a folder or file the repository (or
    src/posttrain/) has. A stage's output subfolder (`model/`), outputs/ and other repositories' paths are not ours."""
    spans = []
    for span in TICKED.findall(FENCE.sub("", text)):
        if "://" in span or not PATH_LIKE.match(span) or span.startswith("outputs/"):
            continue
        first = span.split("/")[0]
        if any((root / first).exists() for root in ROOTS):
            spans.append(span)
    return spans


def test_named_repo_paths_finds_paths_only():
    text = "`src/posttrain/cli.py`, `docs/`, `model/`, `s3://b/x.py`, `outputs/rl/`, `posttrain rl`, `rl.steps`\n```\n`docs/x.md`\n```"
    assert named_repo_paths(text) == ["src/posttrain/cli.py", "docs/"]


def test_backticked_repository_paths_exist():
    dangling = [f"{page.relative_to(REPO)}: `{span}`" for page in PAGES for span in named_repo_paths(page.read_text())
                if not any((root / span).exists() for root in ROOTS)]
    assert not dangling, "paths named in the docs that do not exist:\n  " + "\n  ".join(dangling)
