"""Record llama.cpp's outputs for the tiny factory models as committed fixtures.

    .venv/bin/python -m tests.oracle.record_fixtures   (needs llama_cpp; `make oracle-fixtures`)

Writes tests/fixtures/oracle/<preset>-<weights>-<seed>.npz with the model file's sha256,
token ids of TOKENIZE_STRINGS, last-position logits of logit_prompts() and greedy continuations.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from engine.synthetic.factory import make_model
from engine.synthetic.parity_cases import (GREEDY_TOKENS, PARITY_MODELS, TOKENIZE_STRINGS, greedy_prompts,
                                         logit_prompts)
from bench import llama_runner

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "oracle"


def record(preset: str, weights: str, seed: int, workdir: Path) -> Path:
    path = make_model(workdir / f"{preset}-{weights}-{seed}.gguf", preset, weights, seed)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    llm = llama_runner.open_llama(str(path))
    tokens = llama_runner.tokenize(llm, TOKENIZE_STRINGS)
    logits = np.stack([llama_runner.last_logits(llm, p) for p in logit_prompts()])
    greedy = [llama_runner.greedy(llm, p, GREEDY_TOKENS) for p in greedy_prompts()]
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{preset}-{weights}-{seed}.npz"
    np.savez_compressed(out, logits=logits.astype(np.float32), greedy=np.array(greedy, dtype=np.int32),
                        meta=np.array(json.dumps({"sha256": sha, "tokens": tokens})))
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        for preset, weights, seed in PARITY_MODELS:
            print(record(preset, weights, seed, Path(d)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
