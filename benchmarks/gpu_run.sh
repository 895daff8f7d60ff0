#!/usr/bin/env bash
# One prepared, time-boxed GPU run (`make gpu-run`): the CUDA tests (tests/gpu), then the GRPO step benchmark
# against TRL's GRPOTrainer in the same process at the anchor shape (Qwen2-0.5B's 358M transformer, bf16, 64 prompts
# x G=8 x 128 new tokens) and at SmolLM2-135M's shape (same batch), each with rollout tokens/s of `generate`, our
# decoder, and our decoder replayed as CUDA graphs. Writes into $OUT (default outputs/gpu): run.log, gpu-tests.xml,
# grpo_anchor.json, grpo_smollm2.json and summary.md (benchmarks/gpu_summary.py; the table docs/speed.md quotes).
#
# It needs a CUDA machine with torch; it installs nothing from a network. Python packages the machine lacks may
# travel as wheels in .whl/ (installed with --no-deps into a scratch dir that shadows the machine's own). Budgets
# (seconds) keep the whole run under ~9 minutes: GPU_TEST_BUDGET, GPU_BENCH_BUDGET (each benchmark).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
start=$SECONDS
stamp() { printf '[%4ss] %s\n' $((SECONDS - start)) "$*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  stamp "installing $(ls .whl | wc -l) carried wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/posttrain-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/posttrain-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false GX_ANALYTICS_ENABLED=false
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
$PY -c "import torch, transformers, trl; print('torch', torch.__version__, 'cuda', torch.version.cuda, '|', torch.cuda.get_device_name(), \
'| transformers', transformers.__version__, '| trl', trl.__version__)" || exit 1

stamp "tests/gpu"
POSTTRAIN_GPU_TESTS=1 timeout "${GPU_TEST_BUDGET:-180}" $PY -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" \
  --junitxml="$OUT/gpu-tests.xml"
stamp "tests/gpu exit $?"

bench() {  # name, then grpo_step.py arguments
  local name=$1; shift
  stamp "benchmark $name"
  timeout "${GPU_BENCH_BUDGET:-200}" $PY benchmarks/grpo_step.py --device cuda --roofline-n 8192 --json "$OUT/grpo_$name.json" "$@"
  stamp "benchmark $name exit $?"
}
bench anchor --shape anchor
bench smollm2 --shape smollm2 --set model.dtype=bfloat16 --set rl.prompts_per_step=64 --set rl.group_size=8 --set rl.max_new_tokens=128

$PY benchmarks/gpu_summary.py "$OUT" | tee "$OUT/summary.md"
stamp "done"
