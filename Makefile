# The README's two commands: `make demo` (the main job, no GPU) and `make test`.
PY      := .venv/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
TORCH   := torch==2.13.0
SGLANG  := sglang==0.5.23
# torchvision's PyPI wheel only imports beside CPU torch once tests define its two op schemas (tests/conftest.py).
TVISION := torchvision==0.28.0
# sglang-router's parser checks the PD router line the Planner prints (its Rust extension is not run).
ROUTER  := sglang-router==0.3.2
# uv installs the packages (31 s for the test set against pip's ~2 min here, the same versions); pip installs uv and
# torch: its CPU build is a local file that only pip's configuration finds (/opt/wheels), and with it installed uv
# keeps it (the engine extra's range holds 2.13.0).
UV_PIN  := uv==0.13.9
UVPIP   := UV_LINK_MODE=copy .venv/bin/uv pip install -q --python $(PY)
# BFCL v4's data and checkers for `capbench eval`; --no-deps: its own requirements pin numpy 1.26 and pull every
# provider's SDK, sentence-transformers and faiss, none of which its checkers need (bench/eval/bfcl.py).
BFCL    := bfcl-eval==2026.3.23

.PHONY: demo test test-fast lint bench plan-cache clean

# Byte-compiled once, on both cores, not by pip one file at a time: where PYTHONDONTWRITEBYTECODE is set (these
# machines set it) Python never stores what it compiles, and every process compiled pandas, numpy, Locust and DuckDB
# again at its start (2 s of pandas alone): the demo starts a recorder for each of its ~40 stages and a process for
# each twin (the demo took 305 s without, 229 s with, on one loaded host). 14 s of a fresh install here (packages'
# own tests left out: 19 s with them). A stale .pyc of an edited file is ignored.
.venv/core.stamp:
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q $(UV_PIN)
	$(UVPIP) -e .
	$(UVPIP) --no-deps $(BFCL)
	$(PY) -m compileall -q -j 0 -x '/(tests?|pip|setuptools)/' .venv/lib bench loadgen dashboard engine_patches > /dev/null \
	  || true  # a file that does not compile (torch's py312-only test helper) cannot be imported either
	touch $@

# Tests need torch (pinned first so nothing pulls a CUDA build), triton, and SGLang's CPU set-up.
.venv/test.stamp: .venv/core.stamp pyproject.toml requirements/sglang-cpu.txt
	$(PIP) install -q $(TORCH)
	test -x .venv/bin/uv || $(PIP) install -q $(UV_PIN)  # a venv made before uv
	$(UVPIP) -e '.[engine,dev]'
	$(UVPIP) --no-deps $(SGLANG) $(TVISION) $(ROUTER) $(BFCL)
	$(UVPIP) -r requirements/sglang-cpu.txt
	touch $@

# the total, install included, is printed at the end (the goal: under 5 minutes from a fresh clone)
demo:
	@start=$$(date +%s); $(MAKE) --no-print-directory .venv/core.stamp && .venv/bin/capbench demo; rc=$$?; \
	  echo "make demo took $$(( $$(date +%s) - start )) s in all (install included)"; exit $$rc

# The dashboard's browser test drives Debian's chromium (Playwright downloads no browser here).
.venv/chromium.stamp: .venv/core.stamp
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) \
	  || { echo "make test: the browser test needs Debian's chromium: apt-get install chromium"; exit 1; }
	touch $@

# The whole suite, what CI runs, in two pytest processes side by side: Locust patches its process with gevent (see
# tests/conftest.py), so its tests run in a process of their own (xdist's workers do not survive the patching),
# beside the rest spread over the cores (pytest-xdist; a file's tests stay on one worker and share its fixtures).
# Both spend most of their time waiting on subprocesses and wall-clock stages, so together they fill the two
# cores. The few tests that measure latencies and send rates to the millisecond (marked `timing`) run last, alone:
# a second process on the same cores would distort them. The Locust process's report follows the other's.
# One xdist worker more than the cores: the slow files use about a third of the CPU they hold (subprocesses,
# servers, stages and browsers waited on). --no-loadscope-reorder: files go out in collection order, the slow ones
# first (tests/conftest.py), not xdist's default of the files with the most tests first.
XDIST  := -n $(shell echo $$(( $$(nproc) + 1 ))) --dist loadfile --no-loadscope-reorder
LOCUST := CAPBENCH_TESTS=locust $(PY) -m pytest -p no:xdist
# One plan-answer cache for all the run's processes, empty at its start (tests/conftest.py).
TESTCACHE := $(CURDIR)/.pytest-capbench-cache
test test-fast: export CAPBENCH_TEST_CACHE := $(TESTCACHE)
test: .venv/test.stamp .venv/chromium.stamp
	$(PY) -m ruff check .
	@rm -rf $(TESTCACHE) .pytest-locust.log; \
	$(LOCUST) -m "not timing" > .pytest-locust.log 2>&1 & locust=$$!; \
	$(PY) -m pytest $(XDIST); rest=$$?; \
	wait $$locust; loc=$$?; echo "---- $(LOCUST) -m 'not timing'"; cat .pytest-locust.log; \
	test $$rest -eq 0 && test $$loc -eq 0
	$(LOCUST) -m timing

# The inner loop (under 2 minutes on 2 cores): every test not marked slow, outside the Locust process.
test-fast: .venv/test.stamp
	rm -rf $(TESTCACHE)
	$(PY) -m pytest $(XDIST) -m "not slow"

bench: .venv/test.stamp
	$(PY) -m bench.benchmarks.run_all

# The plan answers shipped for the README's first question, the Planner's defaults and validate's replays (data/plan-cache): run after
# changing the model, the catalog, a workload or the simulator (their hashes key every answer).
plan-cache: .venv/core.stamp
	$(PY) -m bench.benchmarks.plan_cache

clean:
	rm -rf .venv .pytest_cache .ruff_cache
