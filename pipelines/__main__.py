"""`python -m pipelines [--check]`: compile every pipeline to pipelines/compiled/ and write the DAGs' spec JSON.

With --check nothing is written; the exit code is 1 if a committed file differs from what would be written.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from kfp import compiler

from pipelines.build import build_all
from posttrain.orchestration.schema import pipeline_spec, render

REPO = Path(__file__).resolve().parents[1]
COMPILED = REPO / "pipelines" / "compiled"
DAG_SPEC = REPO / "dags" / "posttrain_pipelines.json"


def generate(params: Path = REPO / "params.yaml", repo: Path = REPO) -> dict[Path, str]:
    files = {DAG_SPEC: render(pipeline_spec(params, repo))}
    with tempfile.TemporaryDirectory() as tmp:
        for name, pipeline in build_all(params, repo).items():
            target = Path(tmp) / f"{name}.yaml"
            compiler.Compiler().compile(pipeline, str(target))
            # kfp's comment header lists the defaults in an unstable order; the spec below it has them all
            lines = target.read_text().splitlines(keepends=True)
            files[COMPILED / f"{name}.yaml"] = "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")) :])
    return files


def main(argv: list[str]) -> int:
    files = generate()
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO)} (run `make pipelines`)")
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
