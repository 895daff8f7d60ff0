"""The word-problems example (examples/word_problems) through `dvc repro examples/word_problems/dvc.yaml` in a
temporary copy of the repository: the example's scripts write the problems and a byte-level BPE chat checkpoint,
then the library's stages run data -> sft -> rl (rewarded by math_verify) -> eval of both models, read from the
example's own params file, which extends the repository's: a change to either file re-runs what it affects.

The budgets are the example's, shortened to fit the suite: this checks the wiring and that RL is fed a real signal
(SFT has learnt the answer format, and some RL groups hold both right and wrong answers, so GRPO's advantage is not
zero). Whether RL raises held-out pass@1 at the example's full budget is measured over seeds in docs/claims.md.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from helpers import REPO, dvc, ran_stages

pytestmark = pytest.mark.slow

EXAMPLE = Path("examples/word_problems")
OUT = Path("outputs/word_problems")
BUDGET = {  # the example's budgets, shortened for the suite (merged over examples/word_problems/params.yaml)
    "sft": {"steps": 100, "log_every": 50},
    "rl": {"steps": 2, "prompts_per_step": 8, "checkpoint_every": 0},
    "eval": {"n_prompts": 24, "n_table": 4},
}


def project_copy(root: Path) -> Path:
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / EXAMPLE).mkdir(parents=True)
    for name in ("generate.py", "make_model.py", "dvc.yaml"):
        shutil.copy(REPO / EXAMPLE / name, root / EXAMPLE / name)
    params = yaml.safe_load((REPO / EXAMPLE / "params.yaml").read_text())
    for section, values in BUDGET.items():
        params[section] = {**params.get(section, {}), **values}
    (root / EXAMPLE / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dvc("init", "--no-scm", "-q", cwd=root)
    dvc("config", "core.analytics", "false", cwd=root)
    return root


def example_stages(names: set[str]) -> set[str]:
    """Stage names without the `examples/word_problems/dvc.yaml:` prefix dvc gives them."""
    return {name.rsplit(":", 1)[-1] for name in names}


def test_the_example_runs_through_dvc_from_its_own_params_file(tmp_path):
    root = project_copy(tmp_path)
    ran = dvc("repro", str(EXAMPLE / "dvc.yaml"), cwd=root)
    assert example_stages(ran_stages(ran)) == {"problems", "checkpoint", "data", "sft", "rl", "eval@sft", "eval@rl"}, ran

    tokenizer_config = json.loads((root / OUT / "checkpoint" / "tokenizer_config.json").read_text())
    assert "chat_template" in tokenizer_config or (root / OUT / "checkpoint" / "chat_template.jinja").is_file()
    sft, rl = (json.loads((root / OUT / "eval" / name / "metrics.json").read_text()) for name in ("sft", "rl"))
    history = json.loads((root / OUT / "rl" / "history.json").read_text())
    mixed = sum(1 - step["reward/math_verify_collapsed"] for step in history) / len(history)
    print(f"\nheld-out pass@1: SFT {sft['pass_at_1']:.3f}, RL {rl['pass_at_1']:.3f}; RL groups with mixed outcomes {mixed:.2f}")
    assert sft["greedy_format_rate"] > 0.8 and sft["n_prompts"] == rl["n_prompts"] == 24
    assert {"pass_at_1", "pass_at_4", "majority_at_4"} <= set(rl) and mixed > 0  # GRPO saw right and wrong answers in a group

    with sqlite3.connect(root / "mlflow.db") as db:
        runs = db.execute("SELECT r.name, r.status FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                          "WHERE e.name = 'word_problems'").fetchall()
    assert len(runs) == 5 and {status for _, status in runs} == {"FINISHED"}, runs

    # a setting the example does not change, in the file it extends (it changes the advantages, so the weights):
    # dvc sees the RL stage's settings changed, and nothing upstream of it (that dvc then re-runs what depends on
    # the RL model is dvc's own behaviour, checked on the main pipeline by test_dvc_pipeline)
    assert json.loads(dvc("status", "--json", str(EXAMPLE / "dvc.yaml"), cwd=root)) == {}
    base = root / "params.yaml"
    text = base.read_text()
    base.write_text(text.replace("\nrl:\n", "\nrl:\n  std_eps: 0.01\n", 1))  # a key params.yaml leaves on its default
    assert base.read_text() != text
    changed = json.loads(dvc("status", "--json", str(EXAMPLE / "dvc.yaml"), cwd=root))
    assert example_stages(set(changed)) == {"rl"}, changed
    assert "params.yaml" in json.dumps(changed["examples/word_problems/dvc.yaml:rl"]), changed
