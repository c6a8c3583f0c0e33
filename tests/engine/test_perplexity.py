"""engine/perplexity.py and `python -m engine perplexity`: llama-perplexity's method (chunks of ctx
tokens from empty state, the second half of each scored), checked against a direct computation."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine.cli import main as cli
from engine.generate import Engine
from engine.perplexity import chunks_of, perplexity


@pytest.fixture(scope="module")
def eng(tiny_model_path):
    return Engine.load(str(tiny_model_path), warm_up=False)


def test_perplexity_is_the_mean_nll_of_each_chunks_second_half(eng):
    ids = np.random.default_rng(3).integers(5, 2000, 100).tolist()
    ctx = 24
    res = perplexity(eng.model, ids, ctx)
    assert (res.chunks, res.tokens, res.scored) == (4, 100, 4 * (ctx - 1 - ctx // 2))
    nll = []
    for c in range(4):   # direct: softmax of each position's logits, token by token
        chunk = ids[c * ctx:(c + 1) * ctx]
        logits = eng.model.forward(np.array(chunk), eng.model.new_state(), logits="all")
        for j in range(ctx // 2, ctx - 1):
            row = logits[j].astype(np.float64)
            p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            nll.append(-math.log(p[chunk[j + 1]]))
    assert res.ppl == pytest.approx(math.exp(np.mean(nll)), rel=1e-9)
    assert res.nll == pytest.approx(np.mean(nll), rel=1e-9)


def test_chunks_follow_llama_perplexity(eng):
    ids = list(range(10, 60))
    chunks = chunks_of(ids, 16, bos_id=7)
    assert len(chunks) == 3 and all(c[0] == 7 for c in chunks)            # the tail (2 tokens) dropped
    assert chunks[1][1:].tolist() == ids[17:32]
    assert [c.tolist() for c in chunks_of(ids, 16, None)][2] == ids[32:48]
    with pytest.raises(ValueError, match="needs at least 64"):
        chunks_of(ids, 32, None)


def test_cli_prints_json_last(tiny_model_path, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The warm Lambda keeps its model in memory between requests. " * 12, encoding="utf-8")
    assert cli(["perplexity", "--model", str(tiny_model_path), "--file", str(text), "--ctx", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["chunks"] >= 2 and out["tokens"] >= 64 and out["ppl"] > 1 and out["scored"] == out["chunks"] * 15
    short = tmp_path / "s.txt"
    short.write_text("too short", encoding="utf-8")
    assert cli(["perplexity", "--model", str(tiny_model_path), "--file", str(short), "--ctx", "512"]) == 1
    assert "needs at least 1024" in capsys.readouterr().err
