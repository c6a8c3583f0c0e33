"""Engine.generate's contract: max_tokens=None fills the context, the snapshot writes wait for
the first token, the result holds the prefill it ran; the one sampling type checks itself."""
from __future__ import annotations

import time

import numpy as np
import pytest

import engine.generate as gen
from engine.errors import ContextOverflow
from engine.generate import Engine
from engine.sampling import SamplingError, SamplingParams
from engine.session import PrefillResult


class Log(list):
    def __call__(self, event, **fields):
        self.append({"event": event, **fields})


class NeverEnds:
    """Greedy, but never an end-of-generation token: the reply runs until a limit stops it."""

    def __init__(self, eog, on_first=None):
        self.eog, self.on_first, self.calls = list(eog), on_first, 0

    def __call__(self, logits):
        self.calls += 1
        if self.calls == 1 and self.on_first:
            self.on_first()
        z = np.array(logits, dtype=np.float64)
        z[self.eog] = -np.inf
        return int(np.argmax(z))

    # the rest of the Sampler interface generate's TokenPicker uses (no bias, no penalties)
    def adjust(self, logits):
        return logits

    def observe(self, token):
        pass


@pytest.fixture
def small_ctx(tiny_model_path, monkeypatch):
    eng = Engine.load(str(tiny_model_path), n_ctx=40, warm_up=False, log=lambda *a, **k: None)
    monkeypatch.setattr(gen, "Sampler", lambda params: NeverEnds(eng.tokenizer.eog_ids))
    return eng


def test_max_tokens_none_fills_the_rest_of_the_context(small_ctx):
    ids = list(range(10, 22))
    r = small_ctx.generate(ids)
    assert (r.completion_tokens, r.max_tokens, r.finish_reason, r.deadline_hit) == (40 - 12, 28, "length", False)
    assert r.prompt_tokens == 12 and len(small_ctx.session.tokens) == 39  # the last token is never fed back
    r = small_ctx.generate(ids, max_tokens=5)
    assert (r.completion_tokens, r.max_tokens) == (5, 5)


def test_what_does_not_fit_is_a_context_overflow_before_any_work(small_ctx):
    with pytest.raises(ContextOverflow) as ei:
        small_ctx.generate(list(range(10, 22)), max_tokens=29)
    assert (ei.value.prompt_tokens, ei.value.max_tokens, ei.value.n_ctx) == (12, 29, 40)
    with pytest.raises(ContextOverflow) as ei:  # no room for even one token
        small_ctx.generate(list(range(1, 41)))
    assert ei.value.max_tokens == 1
    assert small_ctx.session.tokens == []  # nothing was prefilled


def test_the_deadline_is_reported_as_such(small_ctx, monkeypatch):
    # a deadline already past stops the prefill before its first chunk (issue 16): no tokens
    r = small_ctx.generate(list(range(10, 22)), deadline=time.monotonic())
    assert r.finish_reason == "length" and r.deadline_hit and r.completion_tokens == 0
    assert r.prefill.prefilled_tokens == 0
    # one that passes during the decode stops it there
    real = small_ctx.session.step

    def slow(tok):
        time.sleep(0.2)
        return real(tok)

    monkeypatch.setattr(small_ctx.session, "step", slow)
    r = small_ctx.generate(list(range(30, 36)), max_tokens=30, deadline=time.monotonic() + 2.0)
    assert r.finish_reason == "length" and r.deadline_hit and 1 <= r.completion_tokens < 30


def test_the_result_holds_the_prefill_it_ran(small_ctx):
    ids = list(range(10, 22))
    r1 = small_ctx.generate(ids, max_tokens=2)
    assert isinstance(r1.prefill, PrefillResult) and r1.prefill.mode == "batched"
    assert r1.prefill.prefilled_tokens == 12 and r1.prefill.reused_tokens == 0
    r2 = small_ctx.generate(ids + r1.token_ids[:1] + [7], max_tokens=2)
    assert (r2.prefill.mode, r2.prefill.reused_tokens, r2.prefill.prefilled_tokens) == ("extend", 13, 1)


def test_snapshot_writes_wait_until_the_first_token_is_out(tiny_model_path, tmp_path, monkeypatch):
    """The prefill queues its checkpoints for the directory tier; the writer may start only
    once the first token is sampled (writes_held around prefill + first sample)."""
    from engine.settings import Settings, SnapshotSettings

    log = Log()
    eng = Engine.load(str(tiny_model_path), warm_up=False, log=log,
                      settings=Settings(snapshots=SnapshotSettings(dir=str(tmp_path), flush_s=0)))
    first_sample_done = []

    def slow_first():
        time.sleep(0.3)  # the writer, were it free, would have written by now
        first_sample_done.append(time.perf_counter())

    monkeypatch.setattr(gen, "Sampler", lambda params: NeverEnds(eng.tokenizer.eog_ids, slow_first))
    eng.generate(list(range(10, 60)), max_tokens=2)
    assert eng.flush_snapshots(30)
    writes = [e for e in log if e["event"] == "snapshot_write"]
    assert writes and all(w["ok"] for w in writes)
    assert min(w["queued_ms"] for w in writes) >= 300


def test_writes_held_nests_and_hold_outlives_it(tmp_path):
    from engine.snapshots import SnapshotStore

    st = SnapshotStore("f" * 32, [], dir=str(tmp_path), flush_at_exit_s=0, log=lambda *a, **k: None)
    with st.writes_held():
        with st.writes_held():
            pass
        assert not st._released.is_set()  # the outer block still holds
    assert st._released.is_set()
    st.hold()
    with st.writes_held():
        pass
    assert not st._released.is_set()  # hold() lasts until release()
    st.release()
    assert st._released.is_set()


def test_sampling_params_check_themselves_once_naming_the_field():
    for field, kw in [("temperature", {"temperature": -1}), ("top_p", {"top_p": 0}), ("top_p", {"top_p": 1.5}),
                      ("top_k", {"top_k": -2}), ("min_p", {"min_p": 2})]:
        with pytest.raises(SamplingError) as ei:
            SamplingParams(**kw)
        assert ei.value.field == field and field in str(ei.value)
    p = SamplingParams(temperature=0.5)
    with pytest.raises(AttributeError):  # frozen: what was checked stays checked
        p.temperature = -1  # type: ignore[misc]
