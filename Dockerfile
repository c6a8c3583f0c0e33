# syntax=docker/dockerfile:1.7
# warmllm — the Lambda container image (primary deployment). Python 3.12, our response-streaming Runtime API loop as the entry point,
# numba kernels compiled at build time for a CPU every Lambda of that architecture has.
#
#   sam build && sam deploy --guided                      (builds this for template.yaml's Architecture)
#   docker buildx build --platform linux/arm64 -t warmllm:arm64 .
#   docker buildx build --platform linux/amd64 -t warmllm:x86_64 .
#
# Prerequisites: Docker with buildx, and QEMU binfmt to build arm64 on an x86 host
# (docker run --privileged --rm tonistiigi/binfmt --install arm64).
# No model is baked in unless asked: `make image-model MODEL=path/to/model.gguf` stages the file in
# model-bake/ (the only model path .dockerignore lets through) and the image carries it at
# /opt/model/<file>.gguf (deploy with ModelPath=/opt/model/<file>.gguf). Otherwise give ModelS3Uri
# (downloaded to /tmp) or an EFS path.
FROM python:3.12-slim-bookworm

ENV LAMBDA_TASK_ROOT=/var/task \
    PYTHONPATH=/var/task \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    WARMLLM_NUMBA_CACHE_SRC=/opt/numba-cache

WORKDIR /var/task

# Dependencies: exactly pyproject.toml's runtime list (pinned numpy/numba/llvmlite), awslambdaric and
# llguidance (constrained decoding; its abi3 wheel needs glibc 2.31, the base image has 2.34) included,
# and the `serve` extra (uvicorn, prometheus-client): the same image runs resident on ECS/EKS or behind
# the Lambda Web Adapter with `python -m function.serve --host 0.0.0.0` as its command (docs/resident.md).
COPY pyproject.toml ./
RUN python -c "import tomllib; t = tomllib.load(open('pyproject.toml','rb'))['project']; print('\n'.join(t['dependencies'] + t['optional-dependencies']['serve']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && python -c "import llguidance, tokenizers, numba, uvicorn, prometheus_client" \
 && SP=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && rm -rf "$SP/numba/tests" "$SP/numba/cuda" "$SP/numpy/_core/tests" "$SP/llvmlite/tests" \
 && rm /tmp/requirements.txt

COPY engine ./engine
COPY function ./function
# model-bake* matches nothing unless `make image-model` staged a model; pyproject.toml keeps the
# COPY valid either way (and is removed below).
COPY pyproject.toml model-bake* /opt/model/

# Kernel cache: compile for fixed CPU targets with their own feature sets (empty
# NUMBA_CPU_FEATURES), so a build under emulation writes the cache key a real Lambda CPU looks up.
# arm64: two levels, neoverse-v1 with SVE off (Graviton3/4: NEON + sdot + smmla) and neoverse-n1
# (Graviton2, every Graviton runs it; NEON + sdot). x86_64: two levels, cascadelake
# (AVX-512 VNNI: the panel prefill tiles) where the build CPU has it, and x86-64-v3 (AVX2, the
# floor); cpu.json lists what was built and function/numba_cache.py picks the best level the
# Lambda's CPU runs at cold start (the init log line's numba_cpu_name says which).
# /var/task is read-only at run time and numba only uses writable cache directories, so the cache
# is built in /opt/numba-cache and function/numba_cache.py copies it to /tmp/numba-cache at cold start.
# --models /opt/model: a baked-in model's tokenizer is built into the same tree (engine/
# tokenizer_cache.py), so its cold start loads it (~0.1 s) instead of building it (~0.6 s).
# ARM64_CPU=neoverse-v1 (or -v2) builds that one target instead, with SVE (Graviton3/4 only: a
# Graviton2 dies of SIGILL; docs/function.md). Empty, the default: both levels, picked at start.
ARG ARM64_CPU=
RUN set -eux; \
    rm -f /opt/model/pyproject.toml; \
    python -m function.numba_cache build --dir /opt/numba-cache ${ARM64_CPU:+--arm64-cpu "${ARM64_CPU}"} --models /opt/model; \
    python -m compileall -q /var/task/engine /var/task/function; \
    chmod -R a+rX /var/task /opt/numba-cache /opt/model

# Our own Runtime API loop (function/stream_runtime.py): awslambdaric cannot stream a response, and
# the Function URL and REST API stream. It calls function.app.handler / stream_handler; CMD names
# the buffered handler for tools that read it.
ENTRYPOINT ["python", "-m", "function.stream_runtime"]
CMD ["function.app.handler"]
