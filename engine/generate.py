"""Generation: prompt → tokens → session (reuse / prefill) → decode → text, with timings.

`Engine` is what the CLI and the Lambda handler hold: the model (mmap), tokenizer, chat
template and one warm Session.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine import threads as threads_mod
from engine.chat_template import ChatTemplate
from engine.errors import ContextOverflow, ModelLoadError
from engine.gguf_file import GGUFFile
from engine.models.qwen35 import Qwen35
from engine.sampling import Sampler, SamplingParams
from engine.session import Session
from engine.tokenizer import Tokenizer

DEFAULT_N_CTX = 32768

__all__ = ["Engine", "GenerationResult", "SamplingParams"]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    prefill_mode: str
    reused_tokens: int
    prefilled_tokens: int
    tokenize_ms: float
    restore_ms: float
    prefill_ms: float
    decode_ms: float
    snapshot_tier: str | None = None
    snapshot_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def _stop_hold(text: str, stops: Sequence[str]) -> int:
    """How many trailing chars of `text` could still begin a stop string (held back from streaming)."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


class Engine:
    def __init__(self, path: str, model: Qwen35, tokenizer: Tokenizer, template: ChatTemplate | None,
                 thread_config: threads_mod.ThreadConfig, n_ctx: int, load_ms: float) -> None:
        self.path = path
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = template
        self.thread_config = thread_config
        self.n_ctx = n_ctx
        self.load_ms = load_ms
        self.compile_ms = 0.0
        self.model_id = Path(path).stem
        self.session = Session(model, int(os.environ.get("WARMLLM_PREFILL_CHUNK", "512")))

    @property
    def threads(self) -> int:
        return self.thread_config.threads

    @property
    def backend(self) -> str:
        return "numpy+numba"

    @classmethod
    def load(cls, path: str, threads: int | None = None, n_ctx: int | None = None, warm_up: bool = True) -> "Engine":
        t0 = time.perf_counter()
        tc = threads_mod.configure(threads)
        f = GGUFFile(path)
        model = Qwen35(f)
        try:
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: tokenizer: {exc}") from exc
        source = f.get("tokenizer.chat_template")
        template = ChatTemplate(source) if source else None
        limit = n_ctx or int(os.environ.get("WARMLLM_N_CTX", DEFAULT_N_CTX))
        eng = cls(path, model, tokenizer, template, tc, min(limit, model.config.n_ctx_train), (time.perf_counter() - t0) * 1e3)
        if warm_up:
            eng.warm_up()
        return eng

    def warm_up(self) -> None:
        """Compile (or load from NUMBA_CACHE_DIR) every kernel the forward uses, timed apart from load."""
        t0 = time.perf_counter()
        state = self.model.new_state()
        self.model.forward(np.array([0, 0], dtype=np.int64), state, logits="last")
        self.model.forward(np.array([0], dtype=np.int64), state, logits="last")
        self.compile_ms = (time.perf_counter() - t0) * 1e3

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, **template_kwargs) -> str:
        if self.chat_template is None:
            raise ModelLoadError(f"{self.path} has no tokenizer.chat_template; send a prompt instead of messages")
        return self.chat_template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)

    def generate(self, prompt: str | list[int], *, max_tokens: int, sampling: SamplingParams | None = None,
                 stop: Sequence[str] = (), deadline: float | None = None,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        t0 = time.perf_counter()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        tokenize_ms = (time.perf_counter() - t0) * 1e3
        if not ids:
            raise ValueError("prompt is empty: it produced no tokens")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if len(ids) + max_tokens > self.n_ctx:
            raise ContextOverflow(len(ids), max_tokens, self.n_ctx)
        sampler = Sampler(sampling or SamplingParams())
        stops = [s for s in stop if s]

        pre = self.session.prefill(ids)
        t1 = time.perf_counter()
        decoder = self.tokenizer.incremental_decoder()
        eog = self.tokenizer.eog_ids
        out: list[int] = []
        text = ""
        emitted = 0
        finish = "length"
        stopped_by_string = False
        logits = pre.logits
        while True:
            tok = sampler(logits)
            if tok in eog:
                finish = "stop"
                break
            out.append(tok)
            text += decoder.feed(tok)
            hit = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                text = text[:hit]
                finish = "stop"
                stopped_by_string = True
                break
            if on_text:
                safe = len(text) - _stop_hold(text, stops)
                if safe > emitted:
                    on_text(text[emitted:safe])
                    emitted = safe
            if len(out) >= max_tokens or (deadline is not None and time.monotonic() >= deadline):
                break
            logits = self.session.step(tok)
        if not stopped_by_string:
            text += decoder.flush()
        if on_text and len(text) > emitted:
            on_text(text[emitted:])
        decode_ms = (time.perf_counter() - t1) * 1e3
        return GenerationResult(
            text=text, token_ids=out, finish_reason=finish, prompt_tokens=len(ids), completion_tokens=len(out),
            prefill_mode=pre.mode, reused_tokens=pre.reused_tokens, prefilled_tokens=pre.prefilled_tokens,
            tokenize_ms=tokenize_ms, restore_ms=pre.restore_ms, prefill_ms=pre.prefill_ms, decode_ms=decode_ms,
        )
