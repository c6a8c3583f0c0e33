"""Server-sent events as the tokens decode: the OpenAI stream shapes, built incrementally.

One code path serves every ``stream: true`` request. The engine calls ``on_text`` with each piece
of text it can release (engine/generate.py holds back what could still begin a stop string); a
``ChatStream`` / ``CompletionStream`` turns the pieces into chunks and hands each to a writer:

* ``SSEWriter`` over a live response (``HttpStream``: the Lambda Runtime API's streamed POST in
  function/stream_runtime.py, or ``make serve``'s chunked HTTP response) sends each chunk as soon
  as it is made, with ``: keep-alive`` comments while a long prefill runs;
* ``collect_sse`` builds the same chunks into one body for integrations that buffer (HTTP API).

Chat chunks, in order (the shape OpenAI's API streams): a first ``{"role": "assistant",
"content": ""}`` delta; ``reasoning_content`` deltas while the model is inside its reasoning block
(``<think>``; the markers and the tool-call syntax are the family's, engine/conventions.py);
``content`` deltas; ``tool_calls`` deltas (``index``, ``id``, ``type``, ``function.name`` first,
then ``function.arguments``) once a ``<tool_call>`` block has closed and parsed; a chunk with the
``finish_reason`` and an empty delta; with ``stream_options.include_usage`` every chunk carries
``"usage": null`` and a last chunk has ``"choices": []`` and the usage; then ``data: [DONE]``.

What the stream shows is what the buffered answer would say (``function/tool_calls.py``
``parse_output`` is the authority): text that may still turn into a tag (``<think>``,
``</think>``, ``<tool_call>``) or be stripped (trailing whitespace) is held back until it cannot,
and at the end the held remainder is reconciled with the parsed answer. A tool-call block is never
streamed as content: its text is held from ``<tool_call>`` on, and only an unparseable block is
released as content at the end.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from engine.conventions import ChatConventions
from engine.reasoning import split_reasoning

from .tool_calls import CallDelta, CallStream, parse_output
from .tool_calls import finish_reason as reply_finish_reason

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
KEEPALIVE = b": keep-alive\n\n"
DEFAULT_KEEPALIVE_S = 5.0


class StreamClosed(Exception):
    """The other end went away mid-stream (a client disconnect, the Runtime API closing): the
    generation stops, the request line says so, nothing more is written."""


class HttpStream(Protocol):
    """A response whose body goes out as it is written."""

    def start(self, status: int, headers: Mapping[str, str]) -> None: ...

    def write(self, data: bytes) -> None: ...

    def end(self, error_type: str | None = None, error: Mapping | None = None) -> None: ...


def sse_data(obj: dict | str) -> bytes:
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def _partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing chars of `text` are a proper prefix of one of `tags` (held back)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:n]):
                best = max(best, n)
                break
    return best


class SSEWriter:
    """Chunks onto a live HttpStream. The prelude (status 200, SSE headers) goes out with the first
    bytes; a keep-alive comment every `keepalive_s` while nothing else is sent (a long prefill: API
    Gateway's REST streams close after 5 idle minutes, and clients and proxies give up sooner)."""

    def __init__(self, stream: HttpStream, headers: Mapping[str, str], keepalive_s: float = DEFAULT_KEEPALIVE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.headers = {"content-type": SSE_CONTENT_TYPE, "cache-control": "no-cache", **headers}
        self.keepalive_s = keepalive_s
        self.started = False
        self.first_data_at: float | None = None
        self.chunks = 0
        self.keepalives = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def begin(self) -> None:
        """Send the prelude now (before a prefill) and start the keep-alive ticker."""
        with self._lock:
            self._start_locked()
        if self._ticker is None and self.keepalive_s > 0:
            self._ticker = threading.Thread(target=self._tick, name="warmllm-sse-keepalive", daemon=True)
            self._ticker.start()

    def _start_locked(self) -> None:
        if not self.started:
            self.started = True
            self.stream.start(200, self.headers)

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.keepalive_s / 2)):
            with self._lock:
                if self._stop.is_set():
                    return
                if self._clock() - self._last >= self.keepalive_s:
                    try:
                        self.stream.write(KEEPALIVE)
                    except (StreamClosed, OSError):
                        return          # the next send() reports it to the request
                    self.keepalives += 1
                    self._last = self._clock()

    def send(self, chunk: dict | str) -> None:
        with self._lock:
            try:
                self._start_locked()
                self.stream.write(sse_data(chunk))
            except OSError as exc:
                raise StreamClosed(f"{type(exc).__name__}: {exc}") from exc
            self._last = self._clock()
            self.chunks += 1
            if self.first_data_at is None:
                self.first_data_at = self._last

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2.0)


class Collector:
    """The same chunks, kept for one buffered SSE body."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def send(self, chunk: dict | str) -> None:
        self.parts.append(sse_data(chunk))

    def body(self) -> str:
        return b"".join(self.parts).decode("utf-8")


class Sink(Protocol):
    def send(self, chunk: dict | str) -> None: ...


class ChatStream:
    """Chat completion chunks from text pieces (see the module doc for the order and shapes)."""

    def __init__(self, out: Sink, rid: str, created: int, model: str, *, tools: list[dict] | None,
                 conventions: ChatConventions, opens_think: bool, include_usage: bool) -> None:
        self.out, self.rid, self.created, self.model = out, rid, created, model
        self.tools, self.conventions, self.include_usage = tools, conventions, include_usage
        self.opens_think = opens_think and conventions.reasons
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""
        self.calls = CallStream(tools, conventions) if tools else None
        self._opened = False

    def _chunk(self, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
        c: dict = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if self.include_usage:
            c["usage"] = None
        return c

    def open(self) -> None:
        if not self._opened:
            self._opened = True
            self.out.send(self._chunk({"role": "assistant", "content": ""}))

    def _split(self, text: str) -> tuple[str, str, bool]:
        """(reasoning so far, content so far, still inside reasoning) for an unfinished text, by
        the parser's own rule (engine/reasoning.py), with only what can no longer change: partial
        tags and whitespace that may be stripped held."""
        open_, close = self.conventions.think_open, self.conventions.think_close
        if open_ is None or close is None:
            return "", text, False
        lead = text.lstrip()
        if not self.opens_think and _partial_tag_len(lead, (open_,)) == len(lead):
            return "", "", False       # blank, or may still become "<think>"
        split = split_reasoning(text, self.conventions, self.opens_think)
        if split.open:
            r = split.reasoning or ""
            r = r[:len(r) - _partial_tag_len(r, (close,))]
            return r.rstrip(), "", True
        return split.reasoning or "", split.content, False

    def _safe_content(self, content: str, stripped: bool) -> str:
        if self.tools:
            tag = self.conventions.tool_call_open
            cut = content.find(tag)
            if cut >= 0:
                content = content[:cut]
            else:
                content = content[:len(content) - _partial_tag_len(content, (tag,))]
        if stripped or self.tools:
            content = content.rstrip()     # trailing whitespace is stripped if the answer ends here
        return content

    def feed(self, piece: str) -> None:
        self.open()
        self.text += piece
        reasoning, content, thinking = self._split(self.text)
        if reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            self.out.send(self._chunk({"reasoning_content": reasoning[len(self.sent_reasoning):]}))
            self.sent_reasoning = reasoning
        if thinking:
            return
        stripped = self.opens_think or (self.conventions.think_open is not None
                                        and self.text.lstrip().startswith(self.conventions.think_open))
        safe = self._safe_content(content, stripped)
        if safe.startswith(self.sent_content) and len(safe) > len(self.sent_content):
            self.out.send(self._chunk({"content": safe[len(self.sent_content):]}))
            self.sent_content = safe
        if self.calls is not None:
            self._send_calls(self.calls.update(content))

    def _send_calls(self, deltas: list[CallDelta]) -> None:
        for d in deltas:
            if d.id is not None:
                tc = {"index": d.index, "id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}}
            else:
                tc = {"index": d.index, "function": {"arguments": d.arguments}}
            self.out.send(self._chunk({"tool_calls": [tc]}))

    def finish(self, finish_reason: str, text: str | None = None, usage: dict | None = None,
               logprobs: dict | None = None) -> str:
        """The closing chunks, reconciled with the parsed answer; returns the finish reason sent."""
        self.open()
        full = self.text if text is None else text
        parsed = parse_output(full, tools=self.tools, conventions=self.conventions,
                              prompt_opens_think=self.opens_think)
        reasoning = parsed.reasoning or ""
        if reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            self.out.send(self._chunk({"reasoning_content": reasoning[len(self.sent_reasoning):]}))
            self.sent_reasoning = reasoning
        content = parsed.content or ""
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            self.out.send(self._chunk({"content": content[len(self.sent_content):]}))
            self.sent_content = content
        if self.calls is not None:
            # the calls closed in the last piece; any the pieces never showed (a buffering
            # integration handed the whole text at once) come whole
            self._send_calls(self.calls.update(split_reasoning(full, self.conventions, self.opens_think).content))
            for i, tc in enumerate(parsed.tool_calls[self.calls.announced:], start=self.calls.announced):
                fn = tc["function"]
                self._send_calls([CallDelta(i, "", tc["id"], fn["name"]), CallDelta(i, fn["arguments"])])
        finish = reply_finish_reason(finish_reason, parsed.tool_calls)
        # the whole reply's logprobs ride on the finishing chunk (decode does not align them
        # with the released text pieces, which hold back partial tags and stop strings)
        self.out.send(self._chunk({}, finish, logprobs))
        if self.include_usage and usage is not None:
            self.out.send({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "system_fingerprint": None, "choices": [], "usage": usage})
        self.out.send("[DONE]")
        return finish


class CompletionStream:
    """Text completion chunks: each released piece as it comes, then the finish chunk."""

    def __init__(self, out: Sink, rid: str, created: int, model: str, *, include_usage: bool) -> None:
        self.out, self.rid, self.created, self.model, self.include_usage = out, rid, created, model, include_usage
        self.sent = ""

    def _chunk(self, text: str, finish: str | None = None, logprobs: dict | None = None) -> dict:
        c: dict = {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
        if self.include_usage:
            c["usage"] = None
        return c

    def open(self) -> None:
        """Nothing to send before the first text (the completions stream has no role chunk)."""

    def feed(self, piece: str) -> None:
        if piece:
            self.out.send(self._chunk(piece))
            self.sent += piece

    def finish(self, finish_reason: str, text: str | None = None, usage: dict | None = None,
               logprobs: dict | None = None) -> str:
        full = self.sent if text is None else text
        if full.startswith(self.sent) and len(full) > len(self.sent):
            self.feed(full[len(self.sent):])
        self.out.send(self._chunk("", finish_reason, logprobs))
        if self.include_usage and usage is not None:
            self.out.send({"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                           "system_fingerprint": None, "choices": [], "usage": usage})
        self.out.send("[DONE]")
        return finish_reason
