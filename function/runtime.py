"""The warm process: one Engine (the deliberate warm cache) and the request path around it.

``Runtime.start_init()`` runs at module scope (Lambda's init phase): it resolves the model
(``MODEL_PATH`` / ``MODEL_S3_URI``), loads it on a background thread and waits up to
``INIT_BUDGET_S`` (default 8 s, under Lambda's ~10 s init cap). Whatever does not finish in time
finishes inside the first invocation, which waits for it (its ``load_ms``); the init line says
which happened (``"phase": "init"`` or ``"first_invoke"``). A model that cannot load makes every
route a 503 that says why (``/health`` included, with the reason in its body); a failure that
may be transient (S3) is retried on a later request after ``MODEL_RETRY_S`` (default 30 s).

``Runtime.handle(event, context)`` is the Lambda handler body. It never raises: every outcome
is a response plus exactly one request log line.
"""
from __future__ import annotations

import hmac
import os
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.jsonlog import emit
from engine.stages import StageClock

from . import admission
from . import deadline as deadline_mod
from . import events
from . import openai_schema as oa
from . import streaming as sse_mod
from .errors import APIError, bad_request, context_overflow, internal, method_not_allowed, model_unavailable, \
    not_found, unauthorized
from .request_log import RequestLog, init_line
from .settings import FunctionSettings
from .structured import grammar_for, logprob_entries
from .tool_calls import finish_reason, parse_output
from .watchdog import Watchdog

if TYPE_CHECKING:  # loaded in the init thread, never at import (cold start)
    from engine.chat_template import ChatPrompt
    from engine.constraints import GrammarSpec
    from engine.generate import Engine, GenerationResult

STREAMED = object()    # _generate's body when the answer already went out through the stream

ROUTES = {
    "/v1/chat/completions": ("POST", "chat"),
    "/v1/completions": ("POST", "completion"),
    "/v1/models": ("GET", "models"),
    "/health": ("GET", "health"),
}


def _build_grammar_trie(eng: Engine) -> str | None:
    """llguidance's token trie for the vocabulary and the text-marker tables; the error, if any
    (constrained requests then retry the build and report it)."""
    try:
        from engine.constraints import grammar_tokenizer, prepare_markers
        grammar_tokenizer(eng.tokenizer)
        prepare_markers(eng.tokenizer, eng.conventions)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def public_load_reason(exc: BaseException) -> str:
    """Why the model is unavailable, in words an API caller may read: the detail (file paths, S3
    URIs, stack) stays in the ``model_load_error`` log line."""
    public = getattr(exc, "public", None)
    if isinstance(public, str):
        return public + " (details in the function's log: model_load_error)"
    try:
        from engine.errors import ModelLoadError
        if isinstance(exc, ModelLoadError):
            return "the model file is not a usable Qwen3.5 GGUF (details in the function's log: model_load_error)"
    except Exception:
        pass
    return f"the model failed to load ({type(exc).__name__}; details in the function's log: model_load_error)"


def route_of(method: str, path: str) -> tuple[str, str | None]:
    """(route name, model id for /v1/models/{id}) or raise 404/405."""
    if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        if method != "GET":
            raise method_not_allowed(method, path, "GET")
        return "model", path[len("/v1/models/"):]
    if path not in ROUTES:
        raise not_found(method, path)
    want, name = ROUTES[path]
    if method == "HEAD" and want == "GET":
        return name, None
    if method != want:
        raise method_not_allowed(method, path, want)
    return name, None


@dataclass
class _Call:
    """One request on its way through `_handle`: what its route handler needs, and the SSE
    writer a generation opened (the error paths must know whether bytes went out)."""

    rid: str
    kind: str
    log: RequestLog
    cold: bool
    stream: sse_mod.HttpStream | None
    headers: dict[str, str]
    authorized: bool = False
    model_arg: str | None = None
    greq: oa.GenRequest | None = None
    dl: deadline_mod.Deadline | None = None
    writer: sse_mod.SSEWriter | None = None


# the routes with a JSON body: the openai_schema parser of each (looked up per call)
_BODY_PARSERS = {"chat": "parse_chat", "completion": "parse_completion"}


class Runtime:
    def __init__(self, settings: FunctionSettings | None = None, s3_client=None) -> None:
        self.settings = settings if settings is not None else FunctionSettings()
        self.s3_client = s3_client
        self.engine: Engine | None = None
        self.error: str | None = None          # the detail, for the log only (paths, URIs)
        self.error_public: str | None = None   # what a 503 body says (no internal paths)
        self.error_permanent = False
        self.failed_at = 0.0
        self._thread: threading.Thread | None = None
        self._load_started = 0.0
        self._init_reported = False
        self._init_fields: dict = {}
        self.init_extra: dict = {}          # e.g. the numba cache preparation, for the init line
        self.init_clock: StageClock | None = None   # the handler module's clock (app.py), for the first load
        self.init_cpu_flags: frozenset[str] = frozenset()   # the CPU the kernels were loaded on (check_cpu)
        self._state_lock = threading.Lock()
        self.requests_served = 0
        self.started_wall = time.time()
        # called with each request's log line after it is written (the resident server's metrics)
        self.request_observers: list[Callable[[dict], None]] = []
        self.api_key = self.settings.api_key
        self.retry_s = self.settings.model_retry_s
        self.prefill_rate = admission.PrefillRate()   # measured here, for refusing what cannot fit

    @classmethod
    def from_env(cls, environ, s3_client=None) -> Runtime:
        """The function's edge: every setting read from `environ` (os.environ in app.py) once."""
        return cls(FunctionSettings.from_env(environ), s3_client=s3_client)

    # ------------------------------------------------------------------ model loading

    def _load(self) -> None:
        # the first load continues the handler module's clock (function/app.py): the init line's
        # stages then sum to the time from the module's first line to ready
        clock, self.init_clock = (self.init_clock or StageClock()), None
        fields: dict = {"ok": False}
        try:
            from engine.generate import Engine
            from engine.quant import paths

            from . import model_source
            clock.mark("import")
            res = model_source.resolve(self.settings, s3_client=self.s3_client)
            clock.mark("download")      # resolving the model: the S3 download when there is one
            fields.update(model_source=res.source, model_uri=res.uri, model_bytes=res.bytes,
                          downloaded=res.downloaded)
            eng = Engine.load(res.path, settings=self.settings.engine, data=res.data)
            from .numba_cache import cpu_flags
            self.init_cpu_flags = cpu_flags()
            clock.mark_parts(eng.load_stages)
            fields.update(ok=True, model_id=eng.model_id, n_ctx=eng.n_ctx, threads=eng.threads,
                          backend=eng.backend, load_ms=float(eng.load_ms), compile_ms=float(eng.compile_ms),
                          tokenizer_cached=eng.tokenizer.cache_hit, cpu=paths.summary(), kernels=eng.kernel_paths)
            if eng.chat_template_error:        # chat is a 400 saying so; completions work
                fields.update(chat_template_error=eng.chat_template_error)
            # llguidance's token trie (~0.6-0.9 s for Qwen3.5's 248k tokens, holding the GIL) is
            # built here, in init: built on a thread beside the first request, it took that
            # request's interpreter for as long (a first 412-token request 3.2 s, 2.1 s once warm;
            # 2.06 s without the thread)
            grammar_error = _build_grammar_trie(eng)
            clock.mark("grammar")
            if grammar_error:
                fields.update(grammar_error=grammar_error)
            self.engine = eng
            self.error = None
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            try:
                from engine.errors import ModelLoadError
                permanent = isinstance(exc, ModelLoadError)
            except Exception:
                permanent = False
            self.error, self.error_permanent, self.failed_at = why, permanent, time.monotonic()
            self.error_public = public_load_reason(exc)
            fields.update(error=why, permanent=permanent)
            emit({"event": "model_load_error", "error": why, "permanent": permanent,
                  "traceback": traceback.format_exc(limit=8)})
        clock.mark("other")
        # every stage as <stage>_ms; init_ms is their sum, the wall time from the clock's start
        fields.update({f"{k}_ms": v for k, v in clock.stages.items()}, init_ms=clock.total_ms)
        self._init_fields = fields

    def start_init(self, budget_s: float | None = None) -> None:
        """Start loading; wait up to the init budget; print the init line if it finished."""
        budget = self.settings.init_budget_s if budget_s is None else budget_s
        th = self._start_thread()
        th.join(budget)
        if not th.is_alive():
            self._report_init("init")

    def _start_thread(self) -> threading.Thread:
        self._init_reported = False
        self._load_started = time.monotonic()
        th = self._thread = threading.Thread(target=self._load, name="warmllm-model-load", daemon=True)
        th.start()
        return th

    def _report_init(self, phase: str) -> None:
        if self._init_reported:
            return
        self._init_reported = True
        init_line({"phase": phase, **self._init_fields, **self.init_extra})

    # ------------------------------------------------------------------ SnapStart (function/snapstart.py)

    def drop_network_clients(self) -> None:
        """Forget every network client: the next use makes a new one (a connection in a SnapStart
        snapshot is dead after the restore)."""
        self.s3_client = None
        if self.engine is not None:
            self.engine.snapshots.drop_clients()

    def check_cpu(self) -> dict:
        """After a restore: whether this CPU runs the kernels the snapshot holds. They are safe when
        compiled for a named level (NUMBA_CPU_NAME: the image's levels, neoverse-n1 on arm64) or
        when this CPU has every flag the snapshotting one had."""
        from .numba_cache import cpu_flags

        now = cpu_flags()
        missing = sorted(self.init_cpu_flags - now) if self.init_cpu_flags else []
        portable = bool(os.environ.get("NUMBA_CPU_NAME"))
        ok = portable or not missing
        if not ok:
            emit({"event": "snapstart_cpu", "error": "restored on a CPU without flags the kernels were compiled "
                  "for; set NUMBA_CPU_NAME to a portable level", "missing_flags": missing[:20]})
        return {"cpu_ok": ok, "kernels_portable": portable, "cpu_flags_missing": len(missing)}

    def wait_for_engine(self, until_mono: float):
        """The engine, or a 503 saying why not (still loading at the deadline, or failed)."""
        with self._state_lock:
            if (self.engine is None and self.error and not self.error_permanent
                    and (self._thread is None or not self._thread.is_alive())
                    and time.monotonic() - self.failed_at >= self.retry_s):
                emit({"event": "model_load_retry", "previous_error": self.error})
                self.error = None
                self._start_thread()
            th = self._thread if self._thread is not None else self._start_thread()
        if th.is_alive():
            th.join(max(0.0, until_mono - time.monotonic()))
            if th.is_alive():
                raise model_unavailable(f"the model is still loading after "
                                        f"{time.monotonic() - self._load_started:.1f} s; retry shortly")
        self._report_init("first_invoke")
        if self.engine is None:
            raise model_unavailable(self.error_public or "unknown load failure")
        return self.engine

    # ------------------------------------------------------------------ requests

    def handle(self, event, context=None, stream: sse_mod.HttpStream | None = None):
        """The response for `event`; with `stream` (a streaming integration) a ``stream: true``
        generation goes out through it as it decodes and None is returned."""
        t_mono = time.monotonic()
        rid = getattr(context, "aws_request_id", None) or f"local-{uuid.uuid4().hex[:12]}"
        watchdogs: list[Watchdog | None] = []     # filled once the request's log exists
        try:
            return self._handle(event, context, t_mono, rid, watchdogs, stream)
        finally:
            for w in watchdogs:
                if w is not None:
                    w.cancel()

    def handle_stream(self, event, context, stream: sse_mod.HttpStream) -> None:
        """An invocation through a streaming integration (Function URL in RESPONSE_STREAM mode, the
        REST API's STREAM integration; function/stream_runtime.py): SSE generations stream token by
        token, every other answer (JSON, errors, health) is written through `stream` whole."""
        resp = self.handle(event, context, stream=stream)
        if resp is not None:
            write_whole(stream, resp)

    def _handle(self, event, context, t_mono: float, rid: str, watchdogs: list,
                stream: sse_mod.HttpStream | None = None):
        # a line before Lambda's timeout kills us mid-request (function/watchdog.py); its thread
        # starts before the request's clock so its cost is in no stage and not in total_ms
        watchdog = Watchdog.start(context, None, self.settings.watchdog_margin_s)
        watchdogs.append(watchdog)
        with self._state_lock:
            cold = self.requests_served == 0
            self.requests_served += 1
        log = RequestLog(rid, cold=cold, observers=self.request_observers)
        if watchdog is not None:
            watchdog.log = log
        call = _Call(rid=rid, kind=events.kind_of(event), log=log, cold=cold, stream=stream,
                     headers={"x-request-id": rid})
        log.set(kind=call.kind)
        try:
            with log.stage("parse_ms"):
                req = events.normalise(event)
                log.set(method=req.method, path=req.path)
                call.authorized = self._authorized(req)
                # with a key set, an unauthenticated caller learns nothing, not even which routes
                # exist: 401 before 404/405 (only /health answers, in its short form)
                if not call.authorized and req.path != "/health":
                    raise unauthorized()
                route, call.model_arg = route_of(req.method, req.path)
                log.set(route=route)
                if route in _BODY_PARSERS:
                    parse = getattr(oa, _BODY_PARSERS[route])
                    call.greq = parse(req.json_body(self.settings.limits), self.settings.limits)
                    log.set(stream=call.greq.stream, max_tokens=call.greq.max_tokens)
            # a streaming integration has no 29-30 s cut: its own (longer) deadline applies
            api_s = self.settings.stream_deadline_s if stream is not None else self.settings.api_deadline_s
            call.dl = deadline_mod.compute(context, req.received_epoch_ms, t_mono, api_deadline_s=api_s,
                                           margin_s=self.settings.deadline_margin_s)
            return _ROUTE_HANDLERS[route](self, call)
        except sse_mod.StreamClosed as gone:   # the client or the Runtime API went away mid-stream
            emit({"event": "stream_closed", "request_id": rid, "error": str(gone)})
            log.finish(200, "stream_closed")
            return None
        except APIError as err:
            writer = call.writer
            if writer is not None and writer.started:   # the status went out already: say it in the stream
                try:
                    writer.send(err.body())
                    writer.send("[DONE]")
                except sse_mod.StreamClosed:
                    pass
                log.finish(200, err.code)
                return None
            return self._finish(log, call.kind, err.status, err.body(), call.headers, error_code=err.code)
        except Exception as exc:        # a bug in warmllm: never user input
            emit({"event": "error", "request_id": rid, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=12)})
            bug = internal(rid, exc)
            writer = call.writer
            if writer is not None and writer.started and stream is not None:
                try:
                    writer.send(bug.body())
                    stream.end("Function.InternalError", bug.body()["error"])   # the documented error trailers
                except (sse_mod.StreamClosed, OSError):
                    pass
                log.finish(200, bug.code)
                return None
            return self._finish(log, call.kind, bug.status, bug.body(), call.headers, error_code=bug.code)

    # ------------------------------------------------------------------ one handler per route

    def _on_health(self, call: _Call):
        status, body = self._health(call.dl, call.log, call.cold, detailed=call.authorized)
        return self._finish(call.log, call.kind, status, body, call.headers)

    def _engine_for(self, call: _Call) -> Engine:
        assert call.dl is not None      # set before any route handler runs
        with call.log.stage("load_ms"):
            eng = self.wait_for_engine(call.dl.at)
        call.log.set(model=eng.model_id)
        return eng

    def _on_models(self, call: _Call):
        eng = self._engine_for(call)
        return self._finish(call.log, call.kind, 200, oa.model_list(eng.model_id, int(self.started_wall)), call.headers)

    def _on_model(self, call: _Call):
        eng = self._engine_for(call)
        if call.model_arg != eng.model_id:
            raise APIError(404, f"model {call.model_arg!r} does not exist; this function serves "
                                f"{eng.model_id!r}", "invalid_request_error", "model", "model_not_found")
        return self._finish(call.log, call.kind, 200, oa.model_list(eng.model_id, int(self.started_wall))["data"][0],
                            call.headers)

    def _on_generation(self, call: _Call):
        """/v1/chat/completions and /v1/completions."""
        eng = self._engine_for(call)
        greq = call.greq
        assert greq is not None and call.dl is not None  # the generation routes parsed their body
        if call.stream is not None and greq.stream:
            call.writer = sse_mod.SSEWriter(call.stream, call.headers, keepalive_s=self.settings.stream_keepalive_s)
        try:
            # concurrent calls (the resident server's) each take a session of the engine's pool
            status, body, ctype, gen_headers = self._generate(eng, greq, call.log, call.dl, call.writer)
        finally:
            if call.writer is not None:
                call.writer.close()
        if body is STREAMED:
            call.log.finish(status)      # the request line, once, when the stream has ended
            return None
        return self._finish(call.log, call.kind, status, body, {**call.headers, **gen_headers}, content_type=ctype)

    def _finish(self, log: RequestLog, kind: str, status: int, body, headers, *, content_type="application/json",
                error_code=None):
        with log.stage("respond_ms"):
            resp = events.to_response(kind, status, body, content_type=content_type, headers=headers)
        log.finish(status, error_code)
        return resp

    def _authorized(self, req: events.Request) -> bool:
        """No key set, a direct invoke (IAM already allowed it), a Function URL under AWS_IAM auth
        (Lambda checked its SigV4 signature, which is what its Authorization header holds), or the
        right bearer token."""
        if not self.api_key or req.kind == "direct":
            return True
        if req.kind == "function_url" and self.settings.function_url_iam:
            return True
        auth = req.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        return hmac.compare_digest(token.encode(), self.api_key.encode())

    def _health(self, dl, log: RequestLog, cold: bool, *, detailed: bool = True):
        """The health body; without the API key (when one is set) only the status: the model,
        its load error and the runtime's figures are for callers holding the key."""
        with log.stage("load_ms"):
            try:
                eng = self.wait_for_engine(dl.at)
            except APIError as err:
                if not detailed:
                    return 503, {"status": "unavailable"}
                return 503, {"status": "unavailable", "reason": self.error_public or err.message,
                             "model_source": self.settings.model_source,
                             "error": err.body()["error"]}
        log.set(model=eng.model_id)
        if not detailed:
            return 200, {"status": "ok"}
        f = self._init_fields
        return 200, {"status": "ok", "model": eng.model_id, "cold": cold, "warm": not cold,
                     "threads": eng.threads, "backend": eng.backend, "n_ctx": eng.n_ctx,
                     "requests_served": self.requests_served,
                     "uptime_s": round(time.time() - self.started_wall, 1),
                     "init": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in f.items()
                              if k in ("load_ms", "compile_ms", "download_ms", "init_ms", "model_source")}}

    # ------------------------------------------------------------------ generation

    def _generate(self, eng: Engine, greq: oa.GenRequest, log: RequestLog, dl: deadline_mod.Deadline,
                  writer: sse_mod.SSEWriter | None = None) -> tuple[int, object, str, dict[str, str]]:
        """A generation request: the prompt, its constraint, the run, the response. Returns
        (status, body, content type, headers); the body is STREAMED when it went out live."""
        prompt, opens_reasoning = self._prompt(eng, greq, log)
        grammar = self._constraint(eng, greq, log)
        reply = _Reply(eng, greq, opens_reasoning, writer)
        result = self._run(eng, greq, prompt, grammar, reply, log, dl)
        with log.stage("respond_ms"):
            if result.grammar_error:
                # the constraint failed mid-decode (an llguidance limit, a token it refused): what was
                # written is no valid answer, so the client gets an error, never "stop" with a part
                assert grammar is not None
                emit({"event": "grammar_error", "request_id": log.fields.get("request_id"),
                      "field": grammar.field, "error": result.grammar_error})
                raise bad_request(f"the output constraint '{grammar.field}' failed during generation after "
                                  f"{result.completion_tokens} tokens: {result.grammar_error}; a simpler schema, "
                                  "grammar or tool list avoids it", grammar.field, "constraint_failed")
            status, body, ctype = reply.render(result, log)
        return status, body, ctype, {"x-warmllm-prefill-mode": result.prefill.mode}

    def _prompt(self, eng: Engine, greq: oa.GenRequest, log: RequestLog) -> tuple[ChatPrompt | str | list[int], bool]:
        """The prompt the engine runs and whether the template began the reply inside <think>."""
        from engine.chat_template import TemplateLimitError

        if greq.route != "chat":
            assert greq.prompt is not None  # parse_completion requires it
            if isinstance(greq.prompt, list) and greq.prompt and max(greq.prompt) >= eng.tokenizer.n_vocab:
                raise bad_request(f"'prompt' holds token id {max(greq.prompt)}; the vocabulary has "
                                  f"{eng.tokenizer.n_vocab}", "prompt")
            return greq.prompt, False
        with log.stage("template_ms"):
            try:
                # chat_prompt keeps the message boundaries: the prefill checkpoints there, so
                # another conversation with the same system + tools resumes from a snapshot
                cp = eng.chat_prompt(greq.messages, tools=greq.tools, add_generation_prompt=True,
                                     **self._template_kwargs(greq))
            except TemplateLimitError as exc:
                raise bad_request(f"the chat template could not render these messages within its limits: "
                                  f"{exc}", "messages", "template_limit_exceeded") from None
            except ValueError as exc:      # engine.chat_template.TemplateError is a ValueError
                raise bad_request(f"the chat template rejected the messages: {exc}", "messages",
                                  "invalid_messages") from None
        # chat_prompt renders and tokenizes: its tokenizer time is the log's tokenize_ms
        log.add_ms("template_ms", -cp.tokenize_ms)
        log.add_ms("tokenize_ms", cp.tokenize_ms)
        return cp, cp.opens_reasoning

    @staticmethod
    def _constraint(eng: Engine, greq: oa.GenRequest, log: RequestLog) -> GrammarSpec | None:
        """The grammar the request asks for (function/structured.py), its logit_bias checked
        against the vocabulary; a 400 naming the field for one that cannot be enforced."""
        from engine.constraints import GrammarError

        for tid in greq.sampling.logit_bias:
            if tid >= eng.tokenizer.n_vocab:
                raise bad_request(f"'logit_bias' names token {tid}; the vocabulary has {eng.tokenizer.n_vocab}",
                                  f"logit_bias.{tid}")
        try:
            grammar = grammar_for(greq, eng.conventions, eng.tokenizer.marker_texts)
        except GrammarError as exc:
            raise bad_request(f"'{exc.field}' cannot be enforced: {exc.reason}", exc.field,
                              "unsupported_schema") from None
        if grammar is not None:
            log.set(grammar=grammar.kind)
        return grammar

    def _run(self, eng: Engine, greq: oa.GenRequest, prompt: ChatPrompt | str | list[int],
             grammar: GrammarSpec | None, reply: _Reply, log: RequestLog, dl: deadline_mod.Deadline) -> GenerationResult:
        """Prefill and decode, the text going to `reply` as it decodes; engine refusals become
        OpenAI errors."""
        from engine.constraints import GrammarError
        from engine.errors import ContextOverflow

        param = "messages" if greq.route == "chat" else "prompt"

        def admit(tokens: int) -> None:
            # before any prefill work: refuse what the measured rate cannot finish in time
            admission.check(self.prefill_rate, tokens, dl.remaining_s(), param)
            reply.begin()

        t = time.perf_counter()
        try:
            result = eng.generate(prompt, max_tokens=greq.max_tokens, sampling=greq.sampling, stop=list(greq.stop),
                                  deadline=dl.at, on_text=lambda piece: reply.feed(piece, log), admit=admit,
                                  grammar=grammar, logprobs=greq.top_logprobs if greq.logprobs else None)
        except APIError:
            # admission's 413, raised before any prefill: the prompt was tokenized and its prefix
            # looked up, and that time belongs in a stage or the line's stages do not sum to total_ms
            log.add_ms("tokenize_ms", (time.perf_counter() - t) * 1000.0)
            raise
        except ValueError as exc:
            # a refused call has tokenized the prompt and checked its length: that time is tokenize_ms
            log.add_ms("tokenize_ms", (time.perf_counter() - t) * 1000.0)
            if isinstance(exc, ContextOverflow):
                raise context_overflow(exc.prompt_tokens, exc.max_tokens, exc.n_ctx, param) from None
            if isinstance(exc, GrammarError):  # llguidance rejected a construct of the schema / grammar
                raise bad_request(f"'{exc.field}' cannot be enforced: {exc.reason}", exc.field,
                                  "unsupported_schema") from None
            # the engine refusing this input: the client's to fix
            emit({"event": "engine_rejected_input", "error": str(exc), "traceback": traceback.format_exc(limit=6)})
            raise bad_request(f"the engine rejected the input: {exc}", param, "invalid_input") from None
        log.add_generation(result)
        self.prefill_rate.observe(result.prefill.prefilled_tokens, result.prefill.prefill_ms)
        return result

    @staticmethod
    def _template_kwargs(greq: oa.GenRequest) -> dict:
        kw = dict(greq.template_kwargs)
        if greq.tool_choice is not None:
            kw.setdefault("tool_choice", greq.tool_choice)
        for reserved in ("messages", "tools", "add_generation_prompt"):
            if reserved in kw:
                raise bad_request(f"'chat_template_kwargs.{reserved}' cannot be set there; it is a request field",
                                  f"chat_template_kwargs.{reserved}")
        return kw



# route -> its handler (route_of names the route)
_ROUTE_HANDLERS = {"health": Runtime._on_health, "models": Runtime._on_models, "model": Runtime._on_model,
                   "chat": Runtime._on_generation, "completion": Runtime._on_generation}

class _Reply:
    """One generation's response: the text as it decodes (live through an SSE writer, or kept),
    then the body in the route's shape (chat / completion, streamed or JSON)."""

    def __init__(self, eng: Engine, greq: oa.GenRequest, opens_reasoning: bool,
                 writer: sse_mod.SSEWriter | None) -> None:
        self.eng, self.greq, self.opens_reasoning, self.writer = eng, greq, opens_reasoning, writer
        self.chat = greq.route == "chat"
        self.rid = oa.new_id("chatcmpl" if self.chat else "cmpl")
        self.created = oa.now()
        self.pieces: list[str] = []
        self.live = self._stream(writer) if writer is not None else None

    def _stream(self, out: sse_mod.Sink) -> sse_mod.ChatStream | sse_mod.CompletionStream:
        g = self.greq
        if self.chat:
            return sse_mod.ChatStream(out, self.rid, self.created, self.eng.model_id, conventions=self.eng.conventions,
                                      opens_think=self.opens_reasoning,
                                      tools=g.tools if g.parse_tool_calls else None, include_usage=g.include_usage)
        return sse_mod.CompletionStream(out, self.rid, self.created, self.eng.model_id, include_usage=g.include_usage)

    def begin(self) -> None:
        """The prefill is admitted: a live stream sends its first bytes now (keep-alive comments
        follow while the prefill runs)."""
        if self.writer is not None and self.live is not None:
            self.writer.begin()
            self.live.open()

    def feed(self, piece: str, log: RequestLog) -> None:
        if not self.pieces:
            log.mark_ttft()
        self.pieces.append(piece)
        if self.live is not None:
            self.live.feed(piece)        # out on the wire now, while the next token decodes

    def render(self, result: GenerationResult, log: RequestLog) -> tuple[int, object, str]:
        eng, g = self.eng, self.greq
        use = oa.usage(result.prompt_tokens, result.completion_tokens, result.prefill.reused_tokens)
        lps = logprob_entries(eng.tokenizer, result.logprobs) if result.logprobs is not None else None
        if g.stream:
            # one code path: the live stream has sent its pieces already; a buffering integration
            # gets the same chunks fed from the pieces, in one body
            out = sse_mod.Collector()
            s = self.live if self.live is not None else self._stream(out)
            if self.live is None:
                for piece in (self.pieces if "".join(self.pieces) == result.text else [result.text]):
                    s.feed(piece)
            lp = (oa.chat_logprobs(lps) if self.chat else oa.completion_logprobs(lps)) if lps is not None else None
            log.set(finish_reason=s.finish(result.finish_reason, text=result.text, usage=use, logprobs=lp))
            if self.live is not None:
                return 200, STREAMED, sse_mod.SSE_CONTENT_TYPE
            return 200, out.body(), sse_mod.SSE_CONTENT_TYPE
        if self.chat:
            # a reply the template began inside <think> is reasoning until it closes it, also when
            # max_tokens or the deadline cut it first
            parsed = parse_output(result.text, tools=g.tools if g.parse_tool_calls else None,
                                  conventions=self.eng.conventions, prompt_opens_think=self.opens_reasoning)
            finish = finish_reason(result.finish_reason, parsed.tool_calls)
            log.set(finish_reason=finish)
            msg = oa.chat_message(parsed.content, parsed.reasoning, parsed.tool_calls)
            chat_lp = oa.chat_logprobs(lps) if lps is not None else None
            return 200, oa.chat_completion(self.rid, self.created, eng.model_id, msg, finish, use, chat_lp), \
                "application/json"
        log.set(finish_reason=result.finish_reason)
        text_lp = oa.completion_logprobs(lps) if lps is not None else None
        return 200, oa.text_completion(self.rid, self.created, eng.model_id, result.text, result.finish_reason,
                                       use, text_lp), "application/json"


def write_whole(stream: sse_mod.HttpStream, resp) -> None:
    """A buffered handler response (API Gateway proxy shape, or a direct invoke's object) written
    through a streaming integration: status and headers in the prelude, the body in one chunk."""
    import base64
    import json
    if isinstance(resp, dict) and "statusCode" in resp:
        status, headers, body = int(resp["statusCode"]), dict(resp.get("headers") or {}), resp.get("body") or ""
        data = base64.b64decode(body) if resp.get("isBase64Encoded") else str(body).encode("utf-8")
    else:
        status, headers = 200, {"content-type": "application/json"}
        data = json.dumps(resp, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    stream.start(status, headers)
    stream.write(data)
