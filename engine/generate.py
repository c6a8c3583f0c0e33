"""Generation: prompt → tokens → session (reuse / prefill) → decode → text, with timings.

`Engine` is what the CLI and the Lambda handler hold: the model (mmap), tokenizer, chat
template and one warm Session.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np

from engine import threads as threads_mod
from engine.chat_template import ChatTemplate, boundary_offsets
from engine.errors import ContextOverflow, ModelLoadError, PrefillDeadline
from engine.gguf_file import GGUFFile
from engine.quant import paths
from engine.models.qwen35 import Qwen35
from engine.sampling import Sampler, SamplingParams
from engine.session import Session
from engine.settings import Settings
from engine.snapshots import SnapshotStore, state_layout
from engine.tokenizer import Tokenizer


__all__ = ["ChatPrompt", "Engine", "GenerationResult", "SamplingParams"]


@dataclass
class ChatPrompt:
    """A rendered chat prompt with the token positions worth a checkpoint.

    boundaries: where the system + tools block ends and where each completed turn before
    the last user message ends — a later request sharing that much of the conversation
    resumes there (on this instance or, via EFS/S3, on another).
    """

    text: str
    ids: list[int]
    boundaries: list[int] = field(default_factory=list)
    spliced_tokens: int = 0  # leading ids taken from the warm session (its own reply tokens)


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
    deadline_hit: bool = False  # the deadline cut the prefill or the decode


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
                 thread_config: threads_mod.ThreadConfig, n_ctx: int, load_ms: float, *,
                 snapshot_store: SnapshotStore | None = None, settings: Settings | None = None) -> None:
        self.path = path
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = template
        self.thread_config = thread_config
        self.n_ctx = n_ctx
        self.load_ms = load_ms
        self.compile_ms = 0.0
        self.model_id = Path(path).stem
        self.fingerprint = model.file.fingerprint()
        self.settings = settings if settings is not None else Settings()
        # Snapshot tiers from the settings (SNAPSHOT_*, docs/snapshots.md); memory-only by default.
        self.snapshots = snapshot_store if snapshot_store is not None else SnapshotStore.from_settings(
            self.fingerprint, state_layout(model.new_state()), self.settings.snapshots)
        self.session = Session(model, self.settings.prefill_chunk, store=self.snapshots)

    @property
    def threads(self) -> int:
        return self.thread_config.threads

    @property
    def backend(self) -> str:
        return "numpy+numba"

    @property
    def kernel_paths(self) -> dict[str, dict[str, str]]:
        """Per weight format of this model's matrices: the decode and prefill kernels this CPU
        runs (engine/quant/paths.py), for the init log line and the bench receipt."""
        f = self.model.file
        qtypes = {f.tensor(n).qtype for n in f.tensor_names if len(f.tensor(n).shape) == 2}
        return paths.kernel_paths(qtypes)

    @classmethod
    def load(cls, path: str, threads: int | None = None, n_ctx: int | None = None, warm_up: bool = True, *,
             snapshot_store: SnapshotStore | None = None, settings: Settings | None = None) -> Engine:
        """`settings` (default: `Settings()`, the defaults) come from the caller's edge, e.g.
        `Settings.from_env(os.environ)`; `threads` and `n_ctx`, when given, win over them."""
        settings = settings if settings is not None else Settings()
        t0 = time.perf_counter()
        tc = threads_mod.configure(threads if threads is not None else settings.threads)
        f = GGUFFile(path)
        model = Qwen35(f)
        try:
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: tokenizer: {exc}") from exc
        source = f.get("tokenizer.chat_template")
        template = ChatTemplate(source) if source else None
        limit = n_ctx or settings.n_ctx
        eng = cls(path, model, tokenizer, template, tc, min(limit, model.config.n_ctx_train), (time.perf_counter() - t0) * 1e3,
                  snapshot_store=snapshot_store, settings=settings)
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

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None,
                    **template_kwargs) -> ChatPrompt:
        """Render `messages` (with the generation prompt unless add_generation_prompt=False is
        given) and tokenize, keeping the warm session's tokens where the text matches them
        (see `encode_prompt`), with the message-boundary positions for checkpoints."""
        add_gen = template_kwargs.pop("add_generation_prompt", True)
        text = self.render_chat(messages, tools=tools, add_generation_prompt=add_gen, **template_kwargs)
        offsets = self._boundary_offsets(messages, tools, text, template_kwargs)
        ids, spliced = self._encode_reusing(text)
        return ChatPrompt(text, ids, self._offsets_to_positions(ids, offsets), spliced)

    def _boundary_offsets(self, messages: list[dict], tools: list[dict] | None, text: str,
                          kw: dict) -> list[int]:
        """Checkpoint offsets in `text` (engine.chat_template.boundary_offsets: linear in messages)."""
        return boundary_offsets(self.render_chat, messages, tools, text, kw)

    def _offsets_to_positions(self, ids: list[int], offsets: list[int]) -> list[int]:
        """Token positions whose decoded text ends exactly at one of the character offsets
        (an offset inside a token is no boundary and is dropped)."""
        if not offsets:
            return []
        try:
            text = self.tokenizer.decode_bytes(ids).decode("utf-8")
        except UnicodeDecodeError:
            return []
        want = {len(text[:off].encode("utf-8")) for off in offsets}
        positions, pos = [], 0
        for i, t in enumerate(ids):
            pos += len(self.tokenizer.token_bytes(t))
            if pos in want:
                positions.append(i + 1)
        return positions

    def _encode_reusing(self, text: str) -> tuple[list[int], int]:
        """Tokenize `text`; if it begins with exactly the text of the tokens the warm session
        holds, keep those tokens and tokenize only the rest. After a chat turn the session holds
        the prompt plus the model's own reply tokens; the next turn's rendering contains the
        same reply text, and re-tokenizing it may pick different (equally valid) tokens, which
        would break `extend`. Returns (ids, how many leading ids came from the session)."""
        held = self.session.tokens
        if held and self.session.last_logits is not None:
            try:
                head = self.tokenizer.decode_bytes(held).decode("utf-8")
            except UnicodeDecodeError:
                head = None
            if head and len(head) < len(text) and text.startswith(head):
                rest = self.tokenizer.encode(text[len(head):], add_special=False)
                return list(held) + rest, len(held)
        return self.tokenizer.encode(text), 0

    def encode_prompt(self, prompt: str | list[int] | ChatPrompt) -> tuple[list[int], list[int]]:
        """(ids, checkpoint boundaries) for any prompt form generate() accepts."""
        if isinstance(prompt, ChatPrompt):
            return list(prompt.ids), list(prompt.boundaries)
        if isinstance(prompt, str):
            return self._encode_reusing(prompt)[0], []
        return [int(t) for t in prompt], []

    def flush_snapshots(self, timeout: float | None = None) -> bool:
        """Wait for queued snapshot writes (directory, S3); False if `timeout` ran out. The
        handler may call it before returning; atexit does it at process exit."""
        return self.snapshots.flush(timeout)

    def generate(self, prompt: str | list[int] | ChatPrompt, *, max_tokens: int,
                 sampling: SamplingParams | None = None,
                 stop: Sequence[str] = (), deadline: float | None = None,
                 on_text: Callable[[str], None] | None = None,
                 admit: Callable[[int], None] | None = None) -> GenerationResult:
        """`deadline` (time.monotonic()) bounds the prefill (checked between its chunks: past it
        the result has no tokens, finish_reason "length" and deadline_hit) and the decode.
        `admit(n)` sees the number of tokens left to prefill before any prefill work and may
        raise to refuse the request (function/admission.py)."""
        t0 = time.perf_counter()
        ids, boundaries = self.encode_prompt(prompt)
        tokenize_ms = (time.perf_counter() - t0) * 1e3
        if not ids:
            raise ValueError("prompt is empty: it produced no tokens")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if len(ids) + max_tokens > self.n_ctx:
            raise ContextOverflow(len(ids), max_tokens, self.n_ctx)
        sampler = Sampler(sampling or SamplingParams())
        stops = [s for s in stop if s]

        try:
            pre = self.session.prefill(ids, boundaries, release_writes=False, deadline=deadline, admit=admit)
        except PrefillDeadline as cut:
            self.snapshots.release()
            spent = (time.perf_counter() - t0) * 1e3 - tokenize_ms - cut.restore_ms
            return GenerationResult(
                text="", token_ids=[], finish_reason="length", prompt_tokens=len(ids), completion_tokens=0,
                prefill_mode=cut.mode, reused_tokens=cut.reused_tokens, prefilled_tokens=cut.done_tokens,
                tokenize_ms=tokenize_ms, restore_ms=cut.restore_ms, prefill_ms=spent, decode_ms=0.0,
                deadline_hit=True)
        except BaseException:
            self.snapshots.release()
            raise
        t1 = time.perf_counter()
        decoder = self.tokenizer.incremental_decoder()
        eog = self.tokenizer.eog_ids
        out: list[int] = []
        text = ""
        emitted = 0
        finish = "length"
        stopped_by_string = False
        cut_by_deadline = False
        logits = pre.logits
        try:
            tok = sampler(logits)
        finally:  # the first token is out: background snapshot writes may use the CPU now
            self.snapshots.release()
        while True:
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
            if len(out) >= max_tokens:
                break
            if deadline is not None and time.monotonic() >= deadline:
                cut_by_deadline = True
                break
            logits = self.session.step(tok)
            tok = sampler(logits)
        if not stopped_by_string:
            text += decoder.flush()
        if on_text and len(text) > emitted:
            on_text(text[emitted:])
        decode_ms = (time.perf_counter() - t1) * 1e3
        return GenerationResult(
            text=text, token_ids=out, finish_reason=finish, prompt_tokens=len(ids), completion_tokens=len(out),
            prefill_mode=pre.mode, reused_tokens=pre.reused_tokens, prefilled_tokens=pre.prefilled_tokens,
            tokenize_ms=tokenize_ms, restore_ms=pre.restore_ms, prefill_ms=pre.prefill_ms, decode_ms=decode_ms,
            snapshot_tier=pre.snapshot_tier,
            snapshot_bytes=pre.snapshot_bytes if pre.snapshot_tier else pre.checkpoint_bytes,
            timings={"checkpoint_ms": pre.checkpoint_ms, "checkpoints": float(len(pre.checkpoints))},
            deadline_hit=cut_by_deadline,
        )
