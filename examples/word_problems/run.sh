#!/usr/bin/env bash
# Word problems end to end on a checkpoint loaded by path: data -> sft -> rl -> eval (SFT and RL models), tracked in
# MLflow (experiment word_problems). Run from the repository root:  bash examples/word_problems/run.sh
# Outputs go to outputs/word_problems/; pass more --set overrides as arguments (e.g. --set rl.steps=50).
set -euo pipefail
here=examples/word_problems
out=outputs/word_problems
bin=${POSTTRAIN_BIN:-.venv/bin}

[ -f $here/data/train.jsonl ] || $bin/python $here/generate.py --out $here/data
[ -f $here/model/config.json ] || $bin/python $here/make_model.py --data $here/data --out $here/model

settings=(
  --set pipeline.name=word_problems
  --set task.name=dataset
  --set task.options.dataset.path=$here/data/train.jsonl
  --set task.options.dataset.heldout=file
  --set task.options.dataset.heldout_path=$here/data/heldout.jsonl
  --set task.options.dataset.fields.prompt=question
  --set task.options.dataset.fields.completion=solution
  --set 'task.options.dataset.fields.metadata=[kind, steps]'
  --set 'task.options.dataset.system_prompt="Solve the problem. End with: so the answer is N."'
  --set task.options.dataset.answer_pattern=last_number
  --set task.options.dataset.verifier=math
  --set model.path=$here/model
  --set sft.steps=${SFT_STEPS:-600} --set sft.batch_size=32 --set sft.lr=0.003 --set sft.n_examples=0
  --set 'rl.rewards=[{name: math_verify}]'
  --set rl.steps=${RL_STEPS:-60} --set rl.max_new_tokens=40 --set rl.prompts_per_step=16 --set rl.group_size=8 --set rl.lr=0.0003
  --set eval.max_new_tokens=40 --set eval.n_prompts=300
  "$@"
)
$bin/posttrain data "${settings[@]}" --out $out/data
$bin/posttrain sft  "${settings[@]}" --in data=$out/data --out $out/sft --resume
$bin/posttrain rl   "${settings[@]}" --in data=$out/data --in policy=$out/sft --out $out/rl --resume
for model in sft rl; do
  $bin/posttrain eval "${settings[@]}" --in data=$out/data --in model=$out/$model --out $out/eval/$model
done
$bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for model in ("sft", "rl"):
    m = json.load(open(f"{out}/eval/{model}/metrics.json"))
    print(f"{model}: held-out greedy accuracy {m['greedy_accuracy']:.3f}, pass@1 {m.get('pass_at_1', float('nan')):.3f}")
PY
