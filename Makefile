# ddtree-deploy — after cloning: `make demo` (the whole flow on local sandbox hosts) and `make test`.
# Everything installs into a project venv (.venv/, made from $(BOOTSTRAP)), never into the interpreter make was started
# with: a Debian/Ubuntu system Python refuses pip (externally-managed-environment) and a shared one must not change.
# PY=/path/to/python uses that interpreter instead (a venv you made yourself); VENV=dir moves the project venv.
BOOTSTRAP ?= python3
VENV ?= .venv
PY ?= $(VENV)/bin/python
STAMP := .cache/deps.stamp
export TRITON_INTERPRET ?= 1

.PHONY: install deps demo test test-fast test-gpu bench faults lint clean

install: $(STAMP)

# The project venv; with PY set to another interpreter this rule never runs. A Debian/Ubuntu Python without its
# venv module (python3-venv) gets it from apt when make runs as root.
$(VENV)/bin/python:
	@$(BOOTSTRAP) -m venv $(VENV) 2>/dev/null || { rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && $(BOOTSTRAP) -m venv $(VENV); \
	  else echo "cannot make a venv with $(BOOTSTRAP): install its venv module (python3-venv) or pass PY=<a venv's python>"; \
	    exit 1; fi; }
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip

# System packages (sshd for the sandbox hosts, rsync for the snapshot benchmark, zstd for compressed snapshot
# transfers, which the tests exercise) and the project with its extras.
# torch is pinned to the CPU build this machine carries; triton 3.6.0 matches the H200 image (interpreted on CPU).
$(STAMP): $(filter $(VENV)/bin/python,$(PY)) pyproject.toml tests/sglang_v1/requirements-cpu.txt tests/sglang_v2/requirements-cpu.txt \
          $(wildcard tests/sglang_v2/requirements-cpu-*.txt)
	@if ! [ -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null || ! command -v git >/dev/null \
	    || ! command -v zstd >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server rsync git zstd >/dev/null; \
	  else echo "need openssh-server, rsync, git and zstd (run as root or install them)"; exit 1; fi; fi
	$(PY) -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.6.0"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev,kernels,ansible,plot]"
	@# what `import sglang.srt.server_args` (0.5.11) needs for the patch set's CPU tests; no deps, so no CUDA torch
	$(PY) -m pip install -q --disable-pip-version-check click pydantic requests orjson jsonschema jinja2 ipython
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r tests/sglang_v1/requirements-cpu.txt
	@# what the spec-v2 bases (0.5.14 and later: the folders with `traits:`) import beyond that, in their own folder (tests/sglang_v2)
	rm -rf .cache/sglang-v2-deps && $(PY) -m pip install -q --disable-pip-version-check --no-deps \
	  --target .cache/sglang-v2-deps -r tests/sglang_v2/requirements-cpu.txt
	@# bases that pin other versions of some of those (requirements-cpu-<base>.txt): a small folder each, in front
	@for r in tests/sglang_v2/requirements-cpu-*.txt; do b=$${r##*-cpu-}; b=$${b%.txt}; \
	  rm -rf .cache/sglang-v2-deps-$$b && $(PY) -m pip install -q --disable-pip-version-check --no-deps \
	  --target .cache/sglang-v2-deps-$$b -r $$r || exit 1; done
	@mkdir -p .cache && touch $(STAMP)

deps: install

demo: install
	$(PY) -m ddtree_deploy.sandbox.demo

# Every CPU test; a test that skips fails the run unless tests/conftest.py's ALLOWED_SKIPS says why it may.
# In TEST_JOBS worker processes (pytest-xdist): much of the suite waits on sshd hosts and subprocesses, so on 2 cores
# three workers beat two: 17:13 against 18:19 for the 1,694 tests of 2026-12-07 on 2 idle cores (two took 17-29 min
# earlier that month, 28:51 on a box then 30 % slower than an hour before); 16:11 for 1,727 once the longest files
# were collected first (tests/conftest.py LONG_FILES). Each test file runs whole, in order, on one worker (--dist loadfile): a
# sandbox module is one scenario on its own hosts (a module fixture), and a test may build on the state an
# earlier test of its file left; work stealing split files between workers and broke that. TEST_JOBS=0: one process.
TEST_JOBS ?= 3
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)
# The inner loop is CPU-bound (interpreted kernels, no hosts to wait on): two workers on 2 cores (1:39 for 787 tests
# on 2026-12-07; three, 2:14 earlier)
FAST_JOBS ?= 2
XDIST_FAST = $(if $(filter 0,$(FAST_JOBS)),,-n $(FAST_JOBS) --dist loadfile)
test: install
	$(PY) -m pytest -q -m "not gpu" --durations=25 $(XDIST)

# The inner loop (under 2 minutes on 2 cores): no sandbox sshd hosts, no real SGLang wheels unpacked or patched, and
# no test marked slow (whole dry-run benchmarks and proofs); every kernel-against-reference test stays in it.
test-fast: install
	$(PY) -m pytest -q -m "not gpu and not sandbox and not wheels and not slow" $(XDIST_FAST)

test-gpu:
	TRITON_INTERPRET=0 $(PY) -m pytest -q -m gpu

bench: install
	@mkdir -p bench/results
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# the fault-injection suite, long form (the test suite runs its short form): bench/results/faults.md
faults: install
	$(PY) bench/faults.py --trials 20

lint: install
	$(PY) -m ruff check ddtree_deploy tests bench

clean:
	$(PY) -m ddtree_deploy sandbox down || true
	rm -rf .cache build *.egg-info
