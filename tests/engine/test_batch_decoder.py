"""engine/batch.py, the continuous-batching step loop (issue 55): sequences join between steps,
long prompts go in a chunk per step, at most max_num_seqs run at once, stops are per sequence --
and every sequence's greedy output is what it gets run alone (the same chunks, then one token at a
time), bit for bit, including one that starts from a frozen snapshot of its prefix."""
from __future__ import annotations

import numpy as np
import pytest

from engine.batch import BatchDecoder, BatchSequence
from engine.gguf_file import GGUFFile
from engine.models import load_model

CHUNK = 8


@pytest.fixture(scope="module")
def model(model_factory):
    return load_model(GGUFFile(model_factory("tiny", "Q4_K_M", 0)))


def greedy(row: np.ndarray) -> int:
    return int(np.argmax(row))


def alone(model, prompt: list[int], max_tokens: int, state=None) -> list[int]:
    st = state if state is not None else model.new_state()
    done = st.n_tokens
    logits = None
    while done < len(prompt):
        end = min(len(prompt), done + CHUNK)
        logits = model.forward(np.asarray(prompt[done:end], dtype=np.int64), st,
                               logits="last" if end == len(prompt) else "none")
        done = end
    out = [greedy(logits)]
    while len(out) < max_tokens:
        out.append(greedy(model.forward(np.asarray([out[-1]], dtype=np.int64), st)))
    return out


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 2000, n)]


def test_sequences_joining_between_steps_get_what_they_get_alone(model, monkeypatch):
    sizes = [(5, 6), (13, 9), (30, 4), (2, 7), (17, 5), (9, 8), (21, 3)]
    seqs = [BatchSequence(prompt(i, n), m, greedy) for i, (n, m) in enumerate(sizes)]
    dec = BatchDecoder(model, max_num_seqs=3, prefill_chunk=CHUNK)
    widths: list[int] = []
    real = model.decode_batch

    def counted(tokens, states):
        widths.append(len(tokens))
        return real(tokens, states)
    monkeypatch.setattr(model, "decode_batch", counted)
    for s in seqs[:5]:
        dec.add(s)
    peak = 0
    for _ in range(3):
        dec.step()
        peak = max(peak, len(dec.prefilling) + len(dec.running))
    for s in seqs[5:]:                  # join while others run
        dec.add(s)
    while not dec.idle:
        dec.step()
        peak = max(peak, len(dec.prefilling) + len(dec.running))
    monkeypatch.undo()
    assert peak <= 3 and max(widths) >= 2         # batched, never over max_num_seqs
    for s, (n, m) in zip(seqs, sizes):
        assert s.finish_reason == "length" and s.tokens == alone(model, s.prompt, m), (n, m)


def test_a_stop_ends_one_sequence_only(model):
    stops_at = 3
    seen: list[int] = []

    def on_token(tok: int) -> bool:
        seen.append(tok)
        return len(seen) < stops_at
    a = BatchSequence(prompt(1, 11), 8, greedy, on_token=on_token)
    b = BatchSequence(prompt(2, 6), 8, greedy)
    dec = BatchDecoder(model, max_num_seqs=4, prefill_chunk=CHUNK)
    dec.add(a)
    dec.add(b)
    dec.run()
    assert a.finish_reason == "stop" and len(a.tokens) == stops_at and a.tokens == seen
    assert b.finish_reason == "length" and b.tokens == alone(model, b.prompt, 8)


def test_a_sequence_continues_from_a_frozen_snapshot_of_its_prefix(model):
    p = prompt(3, 24)
    snap = model.new_state()
    model.forward(np.asarray(p[:16], dtype=np.int64), snap, logits="none")
    snap.freeze()
    s = BatchSequence(p, 6, greedy, state=snap.fork())
    other = BatchSequence(prompt(4, 9), 6, greedy)
    dec = BatchDecoder(model, max_num_seqs=2, prefill_chunk=CHUNK)
    dec.add(s)
    dec.add(other)
    dec.run()
    assert s.tokens == alone(model, p, 6, snap.copy()) and snap.n_tokens == 16
    assert other.tokens == alone(model, other.prompt, 6)


def test_bad_sequences_are_refused(model):
    dec = BatchDecoder(model)
    with pytest.raises(ValueError, match="prompt token"):
        dec.add(BatchSequence([], 4, greedy))
    with pytest.raises(ValueError, match="max_tokens"):
        dec.add(BatchSequence([1], 0, greedy))
    full = model.new_state()
    model.forward(np.asarray([1, 2], dtype=np.int64), full, logits="none")
    with pytest.raises(ValueError, match="left to prefill"):
        dec.add(BatchSequence([1, 2], 4, greedy, state=full))
    with pytest.raises(ValueError, match="max_num_seqs"):
        BatchDecoder(model, max_num_seqs=0)
