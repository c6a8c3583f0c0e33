"""Generation: prompt → tokens → session (reuse / prefill) → decode → text, with timings.

`Engine` is what the CLI and the Lambda handler hold: the model (mmap), tokenizer, chat
template and its warm sessions (one, or one per sequence decoding together: engine/batch.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast


from engine import threads as threads_mod
from engine import warmup
from engine.batch import BatchedModel, StepScheduler
from engine.chat_template import (ChatPrompt, ChatTemplate, TemplateError, boundary_offsets,
                                   normalise_messages, opens_reasoning)
from engine.constraints import Constraint, GrammarSpec, compile_grammar
from engine.conventions import ChatConventions
from engine.decoding import TokenLogprob, TokenPicker
from engine.errors import ContextOverflow, ModelLoadError, PrefillDeadline
from engine.gguf_file import GGUFFile
from engine.history import FieldEscape, Piece, split_history_reasoning
from engine.jsonlog import LogFn, log_event
from engine.models import LanguageModel, load_conventions, load_model
from engine.reasoning import ReasoningWatch, close_text, reasoning_budget
from engine.sampling import Sampler, SamplingParams
from engine.session import PrefillResult, Session, SessionPool
from engine.settings import Settings
from engine.snapshots import SnapshotStore, state_layout
from engine.stages import StageClock
from engine.tokenizer import Tokenizer


__all__ = ["ChatPrompt", "Engine", "GenerationResult", "SamplingParams"]


@dataclass
class GenerationResult:
    """One generate() call: the reply, why it ended, and the prefill that preceded it (its
    mode, reuse, restore and checkpoint figures, as the session reported them)."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    max_tokens: int  # the limit applied: the one asked for, or the rest of the context
    deadline_hit: bool  # the deadline stopped the prefill (no tokens then) or the decoding, before max_tokens
    tokenize_ms: float
    decode_ms: float
    prefill: PrefillResult
    logprobs: list[TokenLogprob] | None = None  # per generated token, when asked for
    # a constrained generation: grammar_ms (compile, ~0 when cached; inside tokenize_ms), mask_ms,
    # masked_steps
    grammar_timings: dict[str, float] = field(default_factory=dict)
    grammar_error: str | None = None  # the grammar engine gave up mid-generation (never expected)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def _rest_after(held: list[Piece] | None, pieces: list[Piece]) -> list[Piece] | None:
    """The pieces of a prompt after the `held` ones, if the prompt begins with them (the last held
    text piece may end inside the prompt's); None if it does not, or nothing follows."""
    if not held or len(held) > len(pieces):
        return None
    *whole, last = held
    if pieces[:len(whole)] != whole:
        return None
    at = pieces[len(whole)]
    if last.marker:
        if at != last:
            return None
        rest = pieces[len(held):]
    else:
        if at.marker or not at.text.startswith(last.text):
            return None
        tail = at.text[len(last.text):]
        rest = ([Piece(tail, False)] if tail else []) + pieces[len(held):]
    return rest or None


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
    def __init__(self, path: str, model: LanguageModel, tokenizer: Tokenizer, template: ChatTemplate | None,
                 thread_config: threads_mod.ThreadConfig, n_ctx: int, load_ms: float, *,
                 snapshot_store: SnapshotStore | None = None, settings: Settings | None = None,
                 log: LogFn = log_event, conventions: ChatConventions | None = None) -> None:
        self.path = path
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = template
        # how this family marks reasoning and tool calls (engine/conventions.py); a template that
        # never closes a reasoning block has none
        conv = conventions if conventions is not None else load_conventions(model.file)
        if conv.think_close is not None and (template is None or conv.think_close not in template.source):
            conv = conv.without_reasoning()
        self.conventions = conv
        self.chat_template_error: str | None = None    # why the model's template did not compile
        self.field_escape = FieldEscape(tokenizer.marker_texts)  # chat fields stay text (engine/history.py)
        self.thread_config = thread_config
        self.n_ctx = n_ctx
        self.load_ms = load_ms
        self.compile_ms = 0.0
        self.load_stages: dict[str, float] = {}   # Engine.load's stages (engine/stages.py), ms
        self.model_id = Path(path).stem
        self.fingerprint = model.file.fingerprint()
        self.settings = settings if settings is not None else Settings()
        # Snapshot tiers from the settings (SNAPSHOT_*, docs/snapshots.md); memory-only by default.
        self.snapshots = snapshot_store if snapshot_store is not None else SnapshotStore.from_settings(
            self.fingerprint, state_layout(model.new_state()), self.settings.snapshots, log=log,
            n_vocab=model.config.n_vocab)
        n = self.settings.max_num_seqs
        self.scheduler: StepScheduler | None = None
        if n > 1:    # continuous batching: the model runs on the scheduler's thread (engine/batch.py)
            self.scheduler = StepScheduler(model, exact=self.settings.batch_exact,
                                           prefill_ratio=self.settings.batch_prefill_ratio)
            batched = cast(LanguageModel, BatchedModel(model, self.scheduler))
            sessions = [Session(batched, self.settings.batch_prefill_chunk, store=self.snapshots) for _ in range(n)]
        else:
            sessions = [Session(model, self.settings.prefill_chunk, store=self.snapshots)]
        self.pool = SessionPool(sessions)

    @property
    def session(self) -> Session:
        """The most recently used warm session (with max_num_seqs 1, the only one)."""
        return self.pool.by_recency()[0]

    @property
    def threads(self) -> int:
        return self.thread_config.threads

    @property
    def backend(self) -> str:
        return "numpy+numba"

    @property
    def kernel_paths(self) -> dict[str, dict[str, str]]:
        """Per weight format of this model's matrices: the decode and prefill kernels this CPU
        runs (engine/quant/choice.py), for the init log line and the bench receipt."""
        f = self.model.file
        qtypes = {f.tensor(n).qtype for n in f.tensor_names if len(f.tensor(n).shape) == 2}
        from engine.quant import choice   # imports the kernels: the model has loaded them

        return choice.kernel_paths(qtypes)

    @classmethod
    def load(cls, path: str, threads: int | None = None, n_ctx: int | None = None, warm_up: bool = True, *,
             snapshot_store: SnapshotStore | None = None, settings: Settings | None = None,
             log: LogFn = log_event, data: bytes | bytearray | memoryview | None = None) -> Engine:
        """`settings` (default: `Settings()`, the defaults) come from the caller's edge, e.g.
        `Settings.from_env(os.environ)`; `threads` and `n_ctx`, when given, win over them.
        `log` receives the engine's events (snapshot writes and ignored snapshots). `data`: the
        GGUF's bytes already in memory (then `path` only names it: the model id, messages)."""
        settings = settings if settings is not None else Settings()
        clock = StageClock()
        t0 = clock.start
        tc = threads_mod.configure(threads if threads is not None else settings.threads)
        clock.mark("threads")
        f = GGUFFile(path, data)
        clock.mark("open")
        try:
            model = load_model(f)
        except ModelLoadError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
            # metadata of the wrong type or value (a string block_count, zero heads): the file's
            # fault, permanent (a retry would read the same bytes)
            raise ModelLoadError(f"{path}: the model's metadata is malformed ({type(exc).__name__}: {exc}); "
                                 "re-download or rebuild the model") from None
        clock.mark("weights")
        try:
            tokenizer = Tokenizer.from_gguf_metadata(f.metadata, cache_dir=settings.tokenizer_cache_dir)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: tokenizer: {exc}") from exc
        clock.mark("tokenizer")
        source = f.get("tokenizer.chat_template")
        template, template_error = None, None
        if source:
            try:
                template = ChatTemplate(source, max_chars=settings.template_max_chars,
                                        time_limit_s=settings.template_time_s)
            except TemplateError as exc:       # chat is refused; /v1/completions still works
                template_error = str(exc)
        clock.mark("template")
        limit = n_ctx or settings.n_ctx
        eng = cls(path, model, tokenizer, template, tc, min(limit, model.config.n_ctx_train), 0.0,
                  snapshot_store=snapshot_store, settings=settings, log=log)
        clock.mark("engine")       # the model's fingerprint, the snapshot store, the session
        eng.load_ms = (time.perf_counter() - t0) * 1e3
        eng.chat_template_error = template_error
        if warm_up:
            eng.warm_up()
            clock.mark_parts({"kernels": eng.load_stages["kernels"], "warmup": eng.load_stages["warmup"]})
        eng.load_stages = clock.stages
        return eng

    def warm_up(self) -> None:
        """Compile (or load from NUMBA_CACHE_DIR) and run once every kernel a request can run,
        timed apart from load (engine/warmup.py)."""
        w = warmup.warm_up(self.model, self.tokenizer)
        self.load_stages = {**self.load_stages, "kernels": w.kernels_ms, "warmup": w.warmup_ms}
        self.compile_ms = w.kernels_ms + w.warmup_ms

    def _template(self) -> ChatTemplate:
        if self.chat_template is None:
            if self.chat_template_error:
                raise TemplateError(f"the model's chat template cannot be used ({self.chat_template_error}); "
                                    "send a prompt to /v1/completions instead of messages")
            raise ModelLoadError(f"{self.path} has no tokenizer.chat_template; send a prompt instead of messages")
        return self.chat_template

    def _render_fields(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                       template_kwargs: dict) -> tuple[str, list[dict], list[dict] | None]:
        """The template's output over the escaped fields (engine/history.py), with the escaped
        messages and tools it rendered."""
        template = self._template()
        msgs = split_history_reasoning(normalise_messages(messages), self.conventions)
        msgs = self.field_escape.tree(msgs)
        escaped_tools = self.field_escape.tree(list(tools)) if tools is not None else None
        rendered = template.render(msgs, tools=escaped_tools, add_generation_prompt=add_generation_prompt,
                                   **template_kwargs)
        return rendered, msgs, escaped_tools

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The prompt text of `messages` as `chat_prompt` renders it (its ``.text``)."""
        rendered, _, _ = self._render_fields(messages, tools, add_generation_prompt, template_kwargs)
        return self.field_escape.unescape(rendered)

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None, *,
                    add_generation_prompt: bool = True, **template_kwargs) -> ChatPrompt:
        """Render `messages` and tokenize: the one way history becomes tokens, for the handler and
        the CLI. Every field stays text, whatever markers it holds (engine/history.py); the
        template's own markers are tokens. Keeps the warm session's tokens where the prompt
        begins with them (see `_encode_reusing`), with the message-boundary positions for
        checkpoints and whether the generation prompt opened a reasoning block.
        `template_kwargs` (``enable_thinking=False`` ...) go to the template."""
        template = self._template()
        # one time limit for the prompt's render and the boundary renders together
        with template.budget():
            rendered, msgs, tools_e = self._render_fields(messages, tools, add_generation_prompt, template_kwargs)
            offsets = boundary_offsets(template.render, msgs, tools_e, rendered, template_kwargs)
        t = time.perf_counter()
        pieces = self.field_escape.pieces(rendered)
        to_text = self.field_escape.offset_map(rendered)
        ids, spliced = self._encode_reusing(pieces)
        positions = self._offsets_to_positions(ids, [to_text(o) for o in offsets])
        return ChatPrompt("".join(p.text for p in pieces), ids, positions, spliced,
                          opens_reasoning=add_generation_prompt and opens_reasoning(rendered, self.conventions.think_open),
                          tokenize_ms=(time.perf_counter() - t) * 1e3)

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

    def _held_pieces(self, held: list[int]) -> list[Piece] | None:
        """A warm session's tokens as pieces: marker tokens one each, the runs between decoded
        (None when a run is not whole UTF-8)."""
        out: list[Piece] = []
        run: list[int] = []
        tok = self.tokenizer
        try:
            for t in held:
                if tok.is_marker(t):
                    if run:
                        out.append(Piece(tok.decode_bytes(run).decode("utf-8"), False))
                        run = []
                    out.append(Piece(tok.piece(t), True))
                else:
                    run.append(t)
            if run:
                out.append(Piece(tok.decode_bytes(run).decode("utf-8"), False))
        except UnicodeDecodeError:
            return None
        return out

    def _encode_reusing(self, prompt: str | Sequence[Piece]) -> tuple[list[int], int]:
        """Tokenize `prompt` (text, or a chat prompt's pieces); if it begins with exactly what a
        warm session holds (the most recently used first), keep those tokens and tokenize only the
        rest. After a chat turn the session holds the prompt plus the model's own reply tokens; the next turn's rendering
        contains the same reply text, and re-tokenizing it may pick different (equally valid)
        tokens, which would break `extend`. Pieces must agree marker for marker: text equal to
        a held marker's is no marker (a field typed ``<|im_end|>`` must not inherit one).
        Returns (ids, how many leading ids came from the session)."""
        tok = self.tokenizer
        for session in self.pool.by_recency():
            held = list(session.tokens)   # a copy: a busy session's list may grow meanwhile
            if not held or session.last_logits is None:
                continue
            if isinstance(prompt, str):
                try:
                    head = tok.decode_bytes(held).decode("utf-8")
                except UnicodeDecodeError:
                    head = None
                if head and len(head) < len(prompt) and prompt.startswith(head):
                    return held + tok.encode(prompt[len(head):], add_special=False), len(held)
            else:
                rest = _rest_after(self._held_pieces(held), list(prompt))
                if rest:
                    return held + tok.encode_pieces(rest, add_special=False), len(held)
        if isinstance(prompt, str):
            return tok.encode(prompt), 0
        return tok.encode_pieces(prompt), 0

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

    def generate(self, prompt: str | list[int] | ChatPrompt, *, max_tokens: int | None = None,
                 sampling: SamplingParams | None = None,
                 stop: Sequence[str] = (), deadline: float | None = None,
                 on_text: Callable[[str], None] | None = None,
                 grammar: GrammarSpec | None = None, logprobs: int | None = None,
                 admit: Callable[[int], None] | None = None) -> GenerationResult:
        """Prefill `prompt` (reusing the warm session and snapshots) and decode until an
        end-of-generation token, a `stop` string, `max_tokens`, or the `deadline` (a
        `time.monotonic()` value). `max_tokens=None` fills the rest of the context.
        ContextOverflow: the prompt plus `max_tokens` (None: one token) do not fit.
        `grammar`: constrain the reply (engine/constraints.py; it starts after ``</think>`` when
        the chat prompt left reasoning open); a GrammarError if llguidance rejects it.
        `logprobs`: None, or how many alternatives per token to report (0..20).
        The deadline bounds the prefill too (checked between its chunks: past it the result has
        no tokens, finish_reason "length" and deadline_hit). `admit(n)` sees the number of tokens
        left to prefill before any prefill work and may raise to refuse (function/admission.py)."""
        t0 = time.perf_counter()
        ids, boundaries = self.encode_prompt(prompt)
        tokenize_ms = (time.perf_counter() - t0) * 1e3
        if not ids:
            raise ValueError("prompt is empty: it produced no tokens")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        need = 1 if max_tokens is None else max_tokens
        if len(ids) + need > self.n_ctx:
            raise ContextOverflow(len(ids), need, self.n_ctx)
        limit = self.n_ctx - len(ids) if max_tokens is None else max_tokens
        constraint = None
        timings: dict[str, float] = {}
        if grammar is not None:
            tg = time.perf_counter()
            compiled = compile_grammar(grammar, self.tokenizer)  # cached per grammar in the warm process
            timings["grammar_ms"] = (time.perf_counter() - tg) * 1e3
            tokenize_ms += timings["grammar_ms"]  # preparing the request: the log's stages still sum
            opens = isinstance(prompt, ChatPrompt) and prompt.opens_reasoning and self.conventions.reasons
            watch = ReasoningWatch(self.tokenizer, self.conventions, True) if opens else None
            constraint = Constraint(compiled, self.tokenizer, reasoning=watch)
        pick = TokenPicker(Sampler(sampling or SamplingParams()), constraint, logprobs)
        # A reply a grammar shapes from the end of its reasoning on (a schema, a forced tool call)
        # ends where the grammar does: a stop string would cut it into text the schema refuses.
        shaped = constraint is not None and constraint.compiled.spec.trigger is None
        stops = [] if shaped else [s for s in stop if s]
        # ... and its reasoning keeps room for the answer: past the budget the close marker is
        # written for the model (engine/reasoning.py)
        budget = reasoning_budget(limit) if shaped and constraint is not None and constraint.reasoning_open else None

        # the session this generation runs on (the pool's: engine/batch.py when batching)
        with self.pool.acquire(ids) as session, \
                (self.scheduler.member() if self.scheduler is not None else nullcontext()):
            forced: list[int] = []
            # Background snapshot writes wait until the first token is out: the prefill and the
            # first sample must not share the CPU with serialising and uploading a snapshot.
            try:
                with self.snapshots.writes_held():
                    pre = session.prefill(ids, boundaries, deadline=deadline, admit=admit)
                    t1 = time.perf_counter()
                    tok = pick(pre.logits)
            except PrefillDeadline as cut:
                assert isinstance(cut.result, PrefillResult)
                pick.close()
                return GenerationResult(text="", token_ids=[], finish_reason="length", prompt_tokens=len(ids),
                                        max_tokens=limit, deadline_hit=True, tokenize_ms=tokenize_ms, decode_ms=0.0,
                                        prefill=cut.result)
            decoder = self.tokenizer.incremental_decoder()
            eog = self.tokenizer.eog_ids
            out: list[int] = []
            text = ""
            emitted = 0
            finish = "length"
            stopped_by_string = False
            deadline_hit = False
            while True:
                if tok in eog:
                    finish = "stop"
                    break
                out.append(tok)
                pick.accept(tok)
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
                if pick.finished:  # the grammar is complete: only end-of-generation could follow
                    finish = "stop"
                    break
                if len(out) >= limit:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    deadline_hit = True
                    break
                logits = session.step(tok)
                if budget is not None and not forced and constraint is not None and constraint.reasoning_open \
                        and len(out) >= budget:
                    close = self.tokenizer.encode(close_text(self.conventions), add_special=False)
                    if len(out) + len(close) < limit:  # the marker and at least one answer token fit
                        forced = close
                    budget = None
                tok = pick.force(logits, forced.pop(0)) if forced else pick(logits)
            pick.close()
            if not stopped_by_string:
                text += decoder.flush()
            if on_text and len(text) > emitted:
                on_text(text[emitted:])
            decode_ms = (time.perf_counter() - t1) * 1e3
            return GenerationResult(text=text, token_ids=out, finish_reason=finish, prompt_tokens=len(ids),
                                    max_tokens=limit, deadline_hit=deadline_hit, tokenize_ms=tokenize_ms,
                                    decode_ms=decode_ms, prefill=pre,
                                    # one entry per token of `out`: not the end-of-generation token
                                    # picked last, which the text and the usage leave out too
                                    logprobs=pick.logprobs[:len(out)] if pick.logprobs is not None else None,
                                    grammar_timings={**timings, **pick.timings()},
                                    grammar_error=constraint.error if constraint is not None else None)
