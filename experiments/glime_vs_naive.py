"""Claim (GLIME): in lifelong editing, GLIME (edit loss + DPO over the model's own generations on
paraphrase prompts, replay of earlier edits, A-GEM gradient constraint) beats naive sequential fine-tuning on
paraphrase generalisation and retention of earlier edits after N edits, while keeping edit success and the
unedited knowledge.

Both arms start from the same base model (the `knowledge` stage's recipe: a tiny model trained on every fact of
the synthetic fact set under every template, cached per config), apply the same seeded stream of N edits with the
same edited parameters (`edit.params`), SGD learning rate and steps per edit, and are measured by the same probes
(recipes/editing/trainer.py). Generalisation is read on the two held-out paraphrase templates, which no arm trains on.

`naive` trains on each edit prompt alone, GLIME also on two paraphrase prompts per edit; `naive_paraphrase` is the
naive fine-tuning on the edit prompt and those same paraphrase prompts (the new object as their target), so GLIME
against it measures the preference, replay and constraint at equal prompt exposure.

    .venv/bin/python experiments/glime_vs_naive.py [--edits N] [--steps STEPS_PER_EDIT] [--json FILE] [--micro]
"""

from __future__ import annotations

import hashlib
import time

import _common as C
from posttrain.recipes.editing.facts import build_fact_set, edit_stream
from posttrain.models import build_tiny, load_pretrained, save_pretrained, train_char_tokenizer
from posttrain.runtime import seed_everything
from posttrain.recipes.editing.trainer import apply_edits
from posttrain.trainers.sft import train_sft

ARMS = ("naive", "naive_paraphrase", "glime")
KEYS = ("edit_success", "retention", "generalization", "paraphrase_accuracy", "locality", "unedited_accuracy")
MICRO_EDIT = ["edit.facts.n_subjects=6", "edit.facts.relations=2", "edit.pretrain.steps=10", "edit.pretrain.batch_size=16"]


def base_model(cfg, facts, seed: int):
    """The base that knows the facts, trained once per (facts, model, pretrain) config."""
    key = cfg.model.model_dump_json() + cfg.edit.facts.model_dump_json() + cfg.edit.pretrain.model_dump_json()
    path = C.CACHE / f"knowledge_{hashlib.sha256(key.encode()).hexdigest()[:16]}_s{seed}"
    if not (path / "done").exists():
        seed_everything(seed)
        tokenizer = train_char_tokenizer([facts.alphabet()])
        model = build_tiny(cfg.model, tokenizer)
        train_sft(model, tokenizer, facts.pretraining_examples(), cfg.edit.pretrain, seed, on_log=lambda s, m: None)
        save_pretrained(model, tokenizer, path)
        (path / "done").write_text("ok")
    return path


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 10, [("--edits", int, 20, "edits in the stream (N)")])
    t0 = time.time()
    cfg = C.load_config(args, [f"edit.steps_per_edit={args.steps}", f"edit.n_edits={args.edits}"] + (MICRO_EDIT if args.micro else []))
    facts = build_fact_set(cfg.edit.facts)
    edits = edit_stream(facts, cfg.edit.n_edits, args.seed)
    path = base_model(cfg, facts, args.seed)
    arms, rows = {}, []
    for arm in ARMS:
        model, tokenizer = load_pretrained(path)
        seed_everything(args.seed)
        edit_cfg = cfg.edit.model_copy(update={"method": arm})
        start = time.time()
        history, metrics = apply_edits(model, tokenizer, facts, edits, edit_cfg, args.seed, on_log=lambda i, m: None)
        arms[arm] = {"metrics": metrics, "seconds": round(time.time() - start, 1), "_history": history,
                     "_cfg": cfg.model_copy(update={"edit": edit_cfg})}
        rows.append({"arm": arm, **{k: metrics[k] for k in KEYS}})
        print(f"{arm}: {arms[arm]['seconds']:.0f}s, generalisation {metrics['generalization']:.4f}, "
              f"retention {metrics['retention']:.4f}", flush=True)
    base = arms[ARMS[0]]["metrics"]
    rows.insert(0, {"arm": "base (before edits)", **{k: base[f"base_{k}"] if f"base_{k}" in base else float("nan") for k in KEYS}})
    text = C.print_table(f"\nGLIME vs naive sequential editing (edit prompt alone, and with the paraphrase prompts) after {len(edits)} edits ({cfg.edit.steps_per_edit} SGD steps each, "
                         f"{len(facts.facts)} facts)", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm, a in arms.items():
            runs[arm] = C.log_arm(a["_cfg"], f"glime/{arm}", a["_history"], a["metrics"], rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "glime_vs_naive", "steps": args.steps, "n_edits": len(edits), "n_facts": len(facts.facts), "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "glime_vs_naive")
