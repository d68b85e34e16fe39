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

.PHONY: install lock run test repro ui docs deploy worker bench gpu-check clean

## constraints.txt pins every package to the versions the suite passed with (`make lock` rewrites it)
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade -c constraints.txt pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	# DeepSpeed JIT-builds its shared-memory comm op on first use (~2 minutes): once, here, not in a test
	$(PY) -c "from deepspeed.accelerator import get_accelerator as a; b = a().create_op_builder('ShareMemCommBuilder'); b and b.load()"
	touch $(STAMP)

install: $(STAMP)

## Resolve pyproject.toml's dependencies afresh, as a clean install would today, into constraints.txt
## (after changing a dependency; then `make install` and `make test` before committing it). It needs no
## .venv: the current pins may be what refuses the change.
lock:
	exec $(PYTHON) .ci/lock.py

## Run the whole pipeline DAG on the built-in sample through Prefect (temporary local server).
## `exec`, here and below: the command is make's own child, so `kill <make's pid>` (which make passes
## on to its child) stops it; a shell in between died of it and left the run going.
run: install
	PATH="$(abspath $(VENV))/bin:$$PATH" exec $(PY) -m flows.pipeline params.yaml

## The test suite (CI calls this through .ci/run), in TEST_WORKERS processes: most tests spend their time
## starting interpreters, ranks and servers, so two workers on two cores take about half the time of one,
## and a third fills the cores while the others wait on servers (pytest 1,102 s against 1,131-1,307 s).
## A test file runs whole in one worker (its session fixtures, e.g. a Prefect server, start once);
## TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 3
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

## A worker that executes runs triggered from the UI (flows/worker.py: a stop also stops its runs, recorded as crashed).
worker: install
	PATH="$(abspath $(VENV))/bin:$$PATH" PREFECT_API_URL=http://127.0.0.1:$(PORT)/api PREFECT_UI_URL=http://127.0.0.1:$(PORT) \
	exec $(PY) -m flows.worker

## Every benchmark's last line (README "Benchmarks"), after installing the references they compare with
## (lm-evaluation-harness, datatrove; Django and Sphinx for their translations). Without a GPU the kernel
## benchmark checks compilation only. BENCHES="train eval" runs those alone. Each benchmark is a child of
## benchmarks.sequence (exec'd, like run): `kill <make's pid>` stops the one in progress and what it started.
BENCH_STAMP := $(VENV)/.bench-installed-stamp
BENCHES ?=
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	touch $(BENCH_STAMP)

bench: install $(BENCH_STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" exec $(PY) -m benchmarks.sequence $(BENCHES)

## On a machine with a CUDA GPU and CuPy, every check that needs one, each logged into GPU_LOGS
## (benchmarks/gpu_check.py says which). It needs no venv: `make gpu-check PY=python3` runs with a system
## python that has torch, CuPy, pydantic, numba and pytest; where there is no GPU it stops at once with one line.
GPU_LOGS ?= gpu-logs
gpu-check:
	exec $(PY) -m benchmarks.gpu_check --logs "$(GPU_LOGS)"

clean:
	find data -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
