# warmllm — every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PRESET ?= tiny
WEIGHTS ?= Q4_K_M
MODEL  ?= models/$(PRESET)-$(WEIGHTS).gguf
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache

.PHONY: lint test-arm64 test-arm64-ci install run generate test test-oracle oracle-fixtures bench serve layer model clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(MODEL): | $(STAMP)
	$(PY) -m engine make-model --preset $(PRESET) --weights $(WEIGHTS) --seed 0 --out $(MODEL)

model: $(MODEL)

# Invokes the Lambda handler locally on a sample event: prints the response and the log line.
EVENT ?= events/chat_http_api.json
run: $(STAMP) $(MODEL)
	MODEL_PATH=$(MODEL) $(PY) -m function $(EVENT)

# The engine alone, without the function.
generate: $(STAMP) $(MODEL)
	$(PY) -m engine generate --model $(MODEL) --prompt "The warm Lambda says" --max-tokens 16 --json

# A local OpenAI-compatible server on 127.0.0.1 that turns requests into HTTP API v2 events.
PORT ?= 8080
serve: $(STAMP) $(MODEL)
	MODEL_PATH=$(MODEL) $(PY) -m function.serve --host 127.0.0.1 --port $(PORT)

# Slimmed dependency layer for the zip deployment; prints its size, fails above 250 MB.
ARCH ?= arm64
layer: $(STAMP)
	$(PY) layers/build.py --arch $(ARCH)

# ruff (rules in pyproject.toml) over every Python tree, mypy over engine/ and function/: zero findings.
lint: $(STAMP)
	$(VENV)/bin/ruff check engine function bench tests scripts layers
	$(VENV)/bin/mypy

test: $(STAMP)
	$(PY) -m pytest -q

# llama.cpp compiles from source (~15 min on 2 cores); never part of `make test`.
test-oracle: $(STAMP)
	$(PY) -c "import llama_cpp" 2>/dev/null || $(PY) -m pip install -q llama-cpp-python
	$(PY) -m pytest -q -m oracle

oracle-fixtures: $(STAMP)
	$(PY) -c "import llama_cpp" 2>/dev/null || $(PY) -m pip install -q llama-cpp-python
	$(PY) -m tests.oracle.record_fixtures

# Speed is a benchmark, never a test: ours vs llama.cpp on the same 0.8B-shaped files, same threads.
# llama.cpp is built twice for it (native, and held to AVX2: bench/build_llama.py), ~15 min each
# the first time; BENCH_ARGS passes options to bench.run (e.g. --modes native --rounds 3;
# --large: the 4B Q4_K_M, 9B Q3_K_M and 9B IQ4_XS files instead, load/ready/RSS/pp512/tg128).
bench: $(STAMP)
	$(PY) -m bench.build_llama native avx2
	$(PY) -m bench.run $(BENCH_ARGS)

# The engine under qemu user-mode in an arm64 userland, once per numba CPU target (docs/arm64.md).
test-arm64: $(STAMP)
	$(PY) tests/arm64/run.py

test-arm64-ci: $(STAMP)
	$(PY) tests/arm64/run.py --ci

clean:
	rm -rf $(VENV) .numba_cache models/*.gguf
