# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 4200

export OMP_NUM_THREADS ?= 1
export DVC_NO_ANALYTICS = 1
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export DO_NOT_TRACK = 1
export GX_ANALYTICS_ENABLED = False
export DS_ACCELERATOR ?= cpu
# a loaded 2-core machine needs more than Prefect's default 20 s to start its temporary server
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180

.PHONY: install run test repro ui docs deploy worker bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# DeepSpeed JIT-builds its shared-memory comm op on first use (~2 minutes): once, here, not in a test
	$(PY) -c "from deepspeed.accelerator import get_accelerator as a; b = a().create_op_builder('ShareMemCommBuilder'); b and b.load()"
	touch $(STAMP)

install: $(STAMP)

## Run the whole pipeline DAG on the built-in sample through Prefect (temporary local server).
## `exec`, here and below: the command is make's own child, so `kill <make's pid>` (which make passes
## on to its child) stops it; a shell in between died of it and left the run going.
run: install
	PATH="$(abspath $(VENV))/bin:$$PATH" exec $(PY) -m flows.pipeline params.yaml

## The test suite (CI calls this through .ci/run), in TEST_WORKERS processes: most tests spend their time
## starting interpreters, ranks and servers, so two workers on two cores take about half the time of one.
## A test file runs whole in one worker (its session fixtures, e.g. a Prefect server, start once);
## TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: install
	PATH="$(abspath $(VENV))/bin:$$PATH" exec $(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile tests

## Reproduce the pipeline with DVC instead (same stage entry points).
repro: install
	PATH="$(abspath $(VENV))/bin:$$PATH" exec $(VENV)/bin/dvc repro

## Prefect UI on http://127.0.0.1:$(PORT), and Data Docs beside it at params.yaml's paths.docs_url
## Both run in the background of one shell that waits for them: a shell waiting on a foreground
## command runs its traps only after it, so `kill <make's pid>` stopped neither server.
ui: install
	$(PY) -m flows.docs_server --params params.yaml & docs=$$!; \
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api PREFECT_UI_URL=http://127.0.0.1:$(PORT) \
	$(VENV)/bin/prefect server start --host 127.0.0.1 --port $(PORT) & server=$$!; \
	trap 'kill $$server $$docs 2>/dev/null; wait; exit 130' INT; \
	trap 'kill $$server $$docs 2>/dev/null; wait; exit 143' TERM; \
	wait $$server; status=$$?; kill $$docs 2>/dev/null; wait; exit $$status

## Data Docs (the validation reports) alone, at params.yaml's paths.docs_url (http://127.0.0.1:4201)
docs: install
	$(PY) -m flows.docs_server --params params.yaml

## Register the deployments of prefect.yaml with the server started by `make ui`.
deploy: install
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect work-pool create local-process --type process --overwrite
	PWD="$(CURDIR)" PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect --no-prompt deploy --all

## A worker that executes runs triggered from the UI.
worker: install
	PATH="$(abspath $(VENV))/bin:$$PATH" PREFECT_API_URL=http://127.0.0.1:$(PORT)/api PREFECT_UI_URL=http://127.0.0.1:$(PORT) \
	exec $(VENV)/bin/prefect worker start --pool local-process

## Every benchmark's last line (README "Benchmarks"), after installing the references they compare with
## (lm-evaluation-harness, datatrove; Django and Sphinx for their translations). Without a GPU the kernel
## benchmark checks compilation only.
BENCHES := extract langid decontam filter filter_agreement dedup blend train resume eval kernels determinism
bench: install
	$(PY) -m pip install -q -e '.[bench]'
	set -e; for b in $(BENCHES); do echo "== benchmarks.$$b"; \
	  PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m benchmarks.$$b; done

## On a machine with a CUDA GPU and CuPy, every check that needs one, each logged into GPU_LOGS: the fused
## kernels against their references, the kernel benchmark with the ~350M step (eager and torch.compile),
## the MinHash kernel against the CPU signatures, and the launch-shape sweep (the table the kernels'
## defaults were chosen from). It needs no venv: `make gpu-check PY=python3` runs with a system python
## that has torch, CuPy and pydantic (the step imports trainer/), and stops at once where there is no
## GPU rather than report the skipped tests as passed.
GPU_LOGS ?= gpu-logs
gpu-check:
	@$(PY) -c "import sys, kernels; sys.exit(0 if kernels.fused_available() else 'gpu-check: no CUDA GPU with CuPy here')"
	mkdir -p "$(GPU_LOGS)"
	status=0; \
	$(PY) -m pytest -q tests/test_kernels_gpu.py > "$(GPU_LOGS)/test_kernels_gpu.log" 2>&1 || status=1; \
	tail -n 3 "$(GPU_LOGS)/test_kernels_gpu.log"; \
	$(PY) -m benchmarks.kernels --reps 30 --step-compile > "$(GPU_LOGS)/kernels.log" 2>&1 || status=1; \
	tail -n 25 "$(GPU_LOGS)/kernels.log"; \
	$(PY) -m tasks.dedup.gpu > "$(GPU_LOGS)/dedup_gpu.log" 2>&1 || status=1; \
	tail -n 3 "$(GPU_LOGS)/dedup_gpu.log"; \
	$(PY) -m benchmarks.kernel_sweep --json "$(GPU_LOGS)/sweep.json" > "$(GPU_LOGS)/sweep.log" 2>&1 || status=1; \
	tail -n 25 "$(GPU_LOGS)/sweep.log"; \
	exit $$status

clean:
	find data -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
