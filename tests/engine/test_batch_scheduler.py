"""engine/batch.py, continuous batching (issue 55): concurrent generate() calls on one engine decode
together, join between steps and prefill their prompts a chunk per step -- and with
WARMLLM_BATCH_EXACT each one's output is what it gets run alone, bit for bit, with its own
sampling, grammar and end (by default the products of a step's rows round differently: the first
token, from the prefill, is the same, the rest may drift). The engine's sessions are a pool: a
conversation's next turn extends its own session while others ran, and prefix snapshots are
shared across sessions."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine import constraints as C
from engine.generate import Engine
from engine.sampling import SamplingParams
from engine.settings import Settings

CHUNK = 8
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def path(model_factory):
    return str(model_factory("tiny", "Q4_K_M", 0))


@pytest.fixture(scope="module")
def alone(path):
    """The reference: one generation at a time, the model on the caller's thread, same chunks."""
    return Engine.load(path, warm_up=False, settings=Settings(max_num_seqs=1, prefill_chunk=CHUNK))


def batched(path, n: int, exact: bool = True) -> Engine:
    return Engine.load(path, warm_up=False,
                       settings=Settings(max_num_seqs=n, batch_prefill_chunk=CHUNK, batch_exact=exact))


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 2000, n)]


def run_threads(jobs: list, start_late: int = 0, eng: Engine | None = None) -> list:
    """Run the callables at once (the last `start_late` once the batch has taken 3 steps);
    their results or exceptions, in order."""
    out: list = [None] * len(jobs)

    def go(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as exc:
            out[i] = exc
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    early = len(jobs) - start_late
    for t in threads[:early]:
        t.start()
    if start_late:
        assert eng is not None and eng.scheduler is not None
        t0 = time.monotonic()
        while eng.scheduler.stats.steps < 3 and time.monotonic() - t0 < 120:
            time.sleep(0.001)
        for t in threads[early:]:
            t.start()
    for t in threads:
        t.join(300)
    return out


def test_concurrent_generations_get_what_they_get_alone(path, alone):
    sizes = [(5, 6), (13, 9), (30, 4), (2, 7), (17, 5), (9, 8), (21, 3)]
    prompts = [prompt(i, n) for i, (n, _) in enumerate(sizes)]
    ref = [alone.generate(p, max_tokens=m, sampling=GREEDY).token_ids for p, (_, m) in zip(prompts, sizes)]
    eng = batched(path, 3)
    jobs = [lambda p=p, m=m: eng.generate(p, max_tokens=m, sampling=GREEDY) for p, (_, m) in zip(prompts, sizes)]
    got = run_threads(jobs, start_late=2, eng=eng)
    assert [r.token_ids for r in got] == ref
    st = eng.scheduler.stats
    assert 2 <= st.max_rows <= 3            # steps decoded several sequences, never more than max_num_seqs
    assert st.mixed_steps >= 1              # a prompt chunk went in beside running decodes
    assert st.prefill_chunks >= sum(-(-n // CHUNK) for n, _ in sizes)   # prompts went in by chunks
    assert all(r.prefill.mode == "batched" for r in got)


def test_by_default_a_step_multiplies_all_rows_at_once(path, alone, monkeypatch):
    """The default (not exact): the step's rows go through each matrix together, once per
    matrix, and every generation still gets its own first token and all its tokens."""
    from engine.weights import Linear

    sizes = [(5, 6), (13, 9), (30, 4), (2, 7)]
    prompts = [prompt(50 + i, n) for i, (n, _) in enumerate(sizes)]
    ref = [alone.generate(p, max_tokens=m, sampling=GREEDY).token_ids for p, (_, m) in zip(prompts, sizes)]
    eng = batched(path, 4, exact=False)
    widths: list[int] = []
    real = Linear.__call__

    def counted(self, x):
        if threading.current_thread() is eng.scheduler._thread and x.shape[0] > 1 and self.name == "output.weight":
            widths.append(x.shape[0])
        return real(self, x)
    monkeypatch.setattr(Linear, "__call__", counted)
    got = run_threads([lambda p=p, m=m: eng.generate(p, max_tokens=m, sampling=GREEDY)
                       for p, (_, m) in zip(prompts, sizes)])
    assert [len(r.token_ids) for r in got] == [m for _, m in sizes]
    assert [r.token_ids[0] for r in got] == [r[0] for r in ref]      # from the prefill: the same
    assert widths and max(widths) == eng.scheduler.stats.max_rows >= 2   # the head saw several rows at once


def test_sampling_grammar_and_stops_stay_per_sequence(path, alone):
    digits = C.regex_grammar(r"[0-9]{4}")
    calls = [dict(prompt=prompt(10, 11), max_tokens=8, sampling=GREEDY, grammar=digits),
             dict(prompt=prompt(11, 6), max_tokens=10, sampling=SamplingParams(temperature=0.9, seed=7)),
             dict(prompt=prompt(12, 19), max_tokens=10, sampling=GREEDY),
             dict(prompt=prompt(13, 4), max_tokens=6, sampling=SamplingParams(temperature=0.7, top_k=5, seed=3))]
    ref = [alone.generate(**c) for c in calls]
    stop_at = ref[2].text[3:5]
    assert stop_at
    calls[2]["stop"] = [stop_at]
    ref[2] = alone.generate(**calls[2])
    assert ref[2].finish_reason == "stop" and len(ref[2].token_ids) < 10
    eng = batched(path, 4)
    got = run_threads([lambda c=c: eng.generate(**c) for c in calls])
    assert [(r.token_ids, r.text, r.finish_reason) for r in got] == [(r.token_ids, r.text, r.finish_reason)
                                                                     for r in ref]
    assert len(got[0].text) == 4 and got[0].text.isdigit()
    assert eng.scheduler.stats.max_rows >= 2


def test_a_generation_that_fails_leaves_the_others_and_its_session(path, alone):
    prompts = [prompt(20 + i, 7 + 3 * i) for i in range(3)]
    ref = [alone.generate(p, max_tokens=12, sampling=GREEDY).token_ids for p in prompts]
    eng = batched(path, 3)

    class Gone(Exception):
        pass

    def leaving(piece: str) -> None:       # a client gone mid-stream: the writer raises
        raise Gone()
    jobs = [lambda p=p: eng.generate(p, max_tokens=12, sampling=GREEDY) for p in prompts]
    jobs[1] = lambda: eng.generate(prompts[1], max_tokens=12, sampling=GREEDY, on_text=leaving)
    got = run_threads(jobs)
    assert isinstance(got[1], Gone)
    assert got[0].token_ids == ref[0] and got[2].token_ids == ref[2]
    again = run_threads([lambda p=p: eng.generate(p, max_tokens=12, sampling=GREEDY) for p in prompts])
    assert [r.token_ids for r in again] == ref   # every session came back to the pool


def test_a_failing_step_reaches_its_sequences_and_the_loop_goes_on(path, alone, monkeypatch):
    eng = batched(path, 2)
    real = eng.model.decode_batch
    failed = []

    def once(tokens, states, **kw):
        if not failed:
            failed.append(len(tokens))
            raise MemoryError("planted")
        return real(tokens, states, **kw)
    monkeypatch.setattr(eng.model, "decode_batch", once)
    got = run_threads([lambda: eng.generate(prompt(30, 5), max_tokens=5, sampling=GREEDY),
                       lambda: eng.generate(prompt(31, 9), max_tokens=5, sampling=GREEDY)])
    assert sum(isinstance(r, MemoryError) for r in got) == failed[0] >= 1
    ref = alone.generate(prompt(31, 9), max_tokens=5, sampling=GREEDY).token_ids
    assert eng.generate(prompt(31, 9), max_tokens=5, sampling=GREEDY).token_ids == ref


SYSTEM = {"role": "system", "content": "You are a terse assistant. " * 6}


def test_a_next_turn_extends_its_own_session_and_snapshots_are_shared(path):
    eng = batched(path, 3)
    a1 = prompt(40, 20)
    r_a1 = eng.generate(a1, max_tokens=4, sampling=GREEDY)
    assert r_a1.prefill.mode == "batched"
    b1 = eng.chat_prompt([SYSTEM, {"role": "user", "content": "First question?"}])
    assert eng.generate(b1, max_tokens=4, sampling=GREEDY).prefill.mode == "batched"
    # the first conversation's next turn: its session is still warm, though not the least
    # recently used free one (with one session, or picking that one, it is gone)
    a2 = a1 + r_a1.token_ids + prompt(41, 6)
    r_a2 = eng.generate(a2, max_tokens=4, sampling=GREEDY)
    # (the session holds the reply but its last token, which was never fed)
    assert r_a2.prefill.mode == "extend" and r_a2.prefill.reused_tokens == len(a1) + len(r_a1.token_ids) - 1
    # another conversation with the second one's system prompt: on another session, from the
    # snapshot the second left at the end of the system message
    c1 = eng.chat_prompt([SYSTEM, {"role": "user", "content": "Something else entirely?"}])
    r_c1 = eng.generate(c1, max_tokens=4, sampling=GREEDY)
    assert r_c1.prefill.mode == "snapshot_memory" and r_c1.prefill.reused_tokens == c1.boundaries[0]


def test_max_num_seqs_one_runs_on_the_callers_thread(alone):
    assert alone.scheduler is None and len(alone.pool.sessions) == 1


def test_beside_decodes_a_prompt_goes_in_pieces_no_longer_than_a_decode_step(path):
    from engine.batch import MIN_PIECE, BatchedModel, StepScheduler
    from engine.gguf_file import GGUFFile
    from engine.models import load_model

    model = load_model(GGUFFile(path))
    sched = StepScheduler(model, prefill_ratio=1.0)
    try:
        assert sched.prefill_piece(64) == 64                    # nothing measured yet: whole
        sched.stats.decode_s, sched.stats.prefill_s_per_token = 0.05, 0.01
        assert sched.prefill_piece(64) == 64                    # alone: whole
        with sched.member(), sched.member():                    # another generation in flight
            assert sched.prefill_piece(64) == 5                 # 50 ms of decode / 10 ms a token
            assert sched.prefill_piece(3) == 3
            sched.prefill_ratio = 2.0
            assert sched.prefill_piece(64) == 10
            sched.prefill_ratio = 0.0                           # off: whole chunks
            assert sched.prefill_piece(64) == 64
            sched.prefill_ratio = 1.0
            sched.stats.decode_s = 0.001
            assert sched.prefill_piece(64) == MIN_PIECE
            # the pieces (5 tokens here; the measured rate moves as they run) give what one pass
            # gives: the captures at their absolute positions, the last position's logits (up to
            # the rounding of other chunk boundaries)
            sched.prefill_piece = lambda want: min(want, 5)
            tokens = np.asarray(prompt(60, 23), dtype=np.int64)
            calls = []
            real = model.forward_capturing

            def counted(t, st, cap, **kw):
                calls.append((len(t), list(cap), kw.get("logits")))
                return real(t, st, cap, **kw)
            model.forward_capturing = counted
            st = model.new_state()
            logits, caps = BatchedModel(model, sched).forward_capturing(tokens, st, [7, 20], logits="last")
            del model.forward_capturing
            ref_state = model.new_state()
            ref_logits, ref_caps = model.forward_capturing(tokens, ref_state, [7, 20], logits="last")
        assert [c[0] for c in calls] == [5, 5, 5, 5, 3] and [c[1] for c in calls] == [[], [7], [], [20], []]
        assert [c[2] for c in calls] == ["none"] * 4 + ["last"]
        assert st.n_tokens == 23 and sorted(caps) == [7, 20] and caps[7].n_tokens == 7
        assert np.allclose(logits, ref_logits, rtol=1e-3, atol=1e-3 * np.abs(ref_logits).max())
        assert int(np.argmax(logits)) == int(np.argmax(ref_logits))
    finally:
        sched.close()
