"""engine/constraints.py: llguidance grammars over our vocabulary. Every constrained output parses
and validates (hypothesis over schemas, random logits standing in for a model: the mask alone must
make the output valid, whatever the model prefers), forced tool calls parse back as tool_calls with
arguments valid for the tool's schema, rejected constructs name themselves, compiles are cached."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import constraints as C
from engine.conventions import ChatConventions
from engine.models.qwen35 import CONVENTIONS as QWEN35
from engine.reasoning import ReasoningWatch
from engine.synthetic.vocab import build_vocab, without_marker_tokens
from engine.tokenizer import Tokenizer, TokenType
from function.tool_calls import coerce, parse_output
from tests.strict_json import integers_stay_integers, strict_loads


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(build_vocab(4096).metadata())


def drive(spec: C.GrammarSpec, tok: Tokenizer, seed: int, max_steps: int = 400,
          reasoning_open: bool = False, prefix: list[int] | None = None) -> tuple[str, C.Constraint]:
    """Decode with random logits under the constraint (greedy on noise: an adversarial 'model')."""
    watch = ReasoningWatch(tok, QWEN35, True) if reasoning_open else None
    c = C.Constraint(C.compile_grammar(spec, tok), tok, reasoning=watch)
    rng = np.random.default_rng(seed)
    out: list[int] = []
    forced = list(prefix or [])
    for _ in range(max_steps):
        logits = rng.standard_normal(tok.n_vocab).astype(np.float32) * 4
        masked = c.mask(logits)
        t = forced.pop(0) if forced else int(np.argmax(masked))
        if t in tok.eog_ids:
            break
        out.append(t)
        c.accept(t)
        if c.finished:
            break
    c.close()
    assert c.error is None, c.error
    return tok.decode(out), c


# ----------------------------------------------------------------------------- schemas

def _leaf() -> st.SearchStrategy[dict]:
    ints = st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]})
    nums = st.tuples(st.integers(-10, 10), st.integers(1, 20)).map(
        lambda t: {"type": "number", "minimum": t[0], "maximum": t[0] + t[1]})
    strs = st.integers(0, 12).map(lambda n: {"type": "string", "maxLength": n})
    pats = st.sampled_from([r"^[a-z]{1,6}$", r"^[0-9]{3}-[0-9]{2}$", r"^(yes|no)$"]).map(
        lambda p: {"type": "string", "pattern": p})
    enums = st.lists(st.sampled_from(["red", "green", "blue", 3, None, True]), min_size=1, max_size=4,
                     unique=True).map(lambda v: {"enum": v})
    # unbounded numbers: the noise picks long digit runs and exponents; each must stay a finite double
    unbounded = st.sampled_from([{"type": "number"}, {"type": "integer"}, {"type": ["number", "null"]},
                                 {"anyOf": [{"type": "integer"}, {"type": "number"}]}])
    return st.one_of(ints, nums, strs, pats, enums, unbounded, st.just({"type": "boolean"}),
                     st.just({"type": "null"}))


def _node(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    arrays = st.tuples(children, st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "maxItems": t[1]})
    objects = st.dictionaries(st.sampled_from(["a", "b", "name", "x_y", "count"]), children, min_size=1,
                              max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req,
                         "additionalProperties": False}))
    return st.one_of(arrays, objects)


SCHEMAS = st.recursive(_leaf(), _node, max_leaves=6).filter(lambda s: s.get("type") == "object") | \
    _node(_leaf()).filter(lambda s: s.get("type") == "object")

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_json_schema_outputs_always_parse_and_validate(tok, schema, seed):
    text, c = drive(C.json_schema_grammar(schema), tok, seed)
    assert c.finished or c.masked_steps, text
    value = strict_loads(text)            # parses strictly, whatever the noise preferred
    jsonschema.validate(value, schema)    # and is what the schema asks for
    integers_stay_integers(value, schema)


def _tool(name: str, params: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params}}


PARAM = st.one_of(_leaf(), st.integers(0, 8).map(lambda n: {"type": "string", "minLength": 1, "maxLength": n + 1}),
                  st.just({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                           "maxItems": 3}))
TOOLS = st.lists(
    st.dictionaries(st.sampled_from(["city", "days", "unit", "query", "n"]), PARAM, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props) or ["_"]), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": [r for r in req if r in props]})),
    min_size=1, max_size=3).map(lambda ps: [_tool(f"fn_{i}", p) for i, p in enumerate(ps)])


# Hermes JSON calls (Qwen2.5 / Qwen3), no reasoning: the other syntax the parser and grammar know
HERMES = ChatConventions("test-hermes", "json", think_open=None, think_close=None)


@FAST
@given(tools=TOOLS, seed=st.integers(0, 2**31), parallel=st.booleans(), conv=st.sampled_from([QWEN35, HERMES]))
def test_forced_tool_calls_parse_back_with_valid_arguments(tok, tools, seed, parallel, conv):
    text, _ = drive(C.tool_call_grammar(tools, conv, parallel=parallel), tok, seed, max_steps=600)
    parsed = parse_output(text, tools=tools, conventions=conv)
    assert parsed.tool_calls, text
    assert parsed.content == ""
    if conv.tool_syntax == "json":   # the text is the Hermes form, not the other syntax
        assert text.startswith('<tool_call>\n{"name": "fn_'), text
    if not parallel:
        assert len(parsed.tool_calls) == 1
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in parsed.tool_calls:
        args = strict_loads(call["function"]["arguments"])
        jsonschema.validate(args, schemas[call["function"]["name"]])
        integers_stay_integers(args, schemas[call["function"]["name"]])


def accepts(spec: C.GrammarSpec, tok: Tokenizer, text: str) -> bool:
    """Whether the grammar lets the model write exactly `text`."""
    import llguidance

    m = llguidance.LLMatcher(C.grammar_tokenizer(tok), spec.grammar)
    ids = tok.encode_text(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


@pytest.mark.parametrize("schema,fine", [
    ({}, '{"a": [1, 2.5]}'), ({"type": "object"}, '{"a": [1, -2.5]}'), ({"type": "array"}, "[1, -2.5]"),
    ({"type": "number"}, "-12.25"), ({"type": "object", "properties": {"a": True}}, '{"a": 0.5}'),
    ({"$defs": {"n": {"type": "number"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}, "[3.5]"),
    ({"type": "array", "items": [{"type": "number"}]}, "[1]")])
def test_no_schema_lets_a_number_overflow_a_double(tok, schema, fine):
    """1e999 is valid RFC 8259 syntax but Infinity to every parser that reads a double, and Infinity
    written back is no JSON: no place a schema admits a number may hold one (nor a 400-digit one)."""
    spec = C.json_schema_grammar(schema)
    assert accepts(spec, tok, fine)
    for text in ("1e999", "-1e400", "1" + "0" * 400, "[1e999]", '{"a": 1e999}', '{"a": [1, {"b": 2E+400}]}'):
        assert not accepts(spec, tok, text), (schema, text)


def test_integers_have_no_fraction_or_exponent_and_fit_a_double(tok):
    spec = C.json_schema_grammar({"type": "integer"})
    assert accepts(spec, tok, "-9007199254740991") and accepts(spec, tok, "42")
    for text in ("9007199254740992", "1e3", "1.0", "+1", "01", "0x1F"):
        assert not accepts(spec, tok, text), text


def test_a_parameter_the_grammar_did_not_write_is_read_strictly():
    """Text of a parameter with no schema (or a model's free text) becomes JSON only if it is RFC
    8259 with finite doubles: 1e999, NaN and Infinity stay strings, never Infinity in arguments."""
    for text in ("1e999", "-Infinity", "NaN", "[1, 1e400]", "1" + "0" * 400):
        assert coerce(text, None) == text and coerce(text, {"type": "number"}) == text
    assert coerce("2.5", {"type": "number"}) == 2.5 and coerce("3.0", {"type": "integer"}) == 3
    assert isinstance(coerce("3.0", {"type": "integer"}), int)
    text = parse_output('<tool_call>\n<function=f>\n<parameter=x>\n1e999\n</parameter>\n</function>\n</tool_call>',
                        tools=[_tool("f", {"type": "object", "properties": {"x": {"type": "number"}}})], conventions=QWEN35)
    assert strict_loads(text.tool_calls[0]["function"]["arguments"]) == {"x": "1e999"}


def test_auto_tool_choice_is_free_until_the_model_opens_a_call(tok):
    tools = [_tool("get", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                                  "maximum": 5}}, "required": ["n"]})]
    spec = C.tool_call_grammar(tools, QWEN35, trigger=True)
    free = tok.encode("Sure, let me look.\n\n")
    open_id = tok.token_id("<tool_call>")
    text, c = drive(spec, tok, seed=3, prefix=[*free, open_id])
    assert text.startswith("Sure, let me look.\n\n<tool_call>")
    calls = parse_output(text, tools=tools, conventions=QWEN35).tool_calls
    assert len(calls) == 1 and 1 <= json.loads(calls[0]["function"]["arguments"])["n"] <= 5


@pytest.fixture(scope="module")
def text_tok() -> Tokenizer:
    """The factory vocabulary with no token for <tool_call>, </think> and their kin."""
    return Tokenizer.from_gguf_metadata(without_marker_tokens(build_vocab(4096)).metadata())


WEATHER = [_tool("get", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
                         "required": ["n"]})]


@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_are_enforced_as_text_without_marker_tokens(text_tok, parallel):
    # issue 52: every forced call on such a vocabulary was a 400 ("unknown special token <tool_call>")
    spec = C.tool_call_grammar(WEATHER, QWEN35, parallel=parallel, marker_tokens=text_tok.marker_texts)
    for seed in range(4):
        text, _ = drive(spec, text_tok, seed, max_steps=300)
        calls = parse_output(text, tools=WEATHER, conventions=QWEN35).tool_calls
        assert calls and (parallel or len(calls) == 1), text
        assert all(1 <= json.loads(c["function"]["arguments"])["n"] <= 5 for c in calls)


def test_auto_starts_once_the_model_writes_the_call_marker_in_text(text_tok):
    spec = C.tool_call_grammar(WEATHER, QWEN35, trigger=True, marker_tokens=text_tok.marker_texts)
    text, c = drive(spec, text_tok, seed=3, prefix=text_tok.encode_text("Let me look. <tool_call>"))
    parsed = parse_output(text, tools=WEATHER, conventions=QWEN35)
    assert parsed.content == "Let me look." and len(parsed.tool_calls) >= 1, text
    assert c.masked_steps > 0


def test_a_text_trigger_ends_on_a_token_boundary(text_tok):
    spec = C.tool_call_grammar(WEATHER, QWEN35, trigger=True, marker_tokens=text_tok.marker_texts)
    c = C.Constraint(C.compile_grammar(spec, text_tok), text_tok)
    for t in text_tok.encode_text("ok <tool_"):
        c.accept(t)
    zero = np.zeros(text_tok.n_vocab, dtype=np.float32)
    # the tokens that would finish the marker and run on past it, found by trying each one
    run_on = {i for i in range(text_tok.n_vocab)
              if (after := ("ok <tool_" + text_tok.decode([i])).partition("<tool_call>"))[1] and after[2]}
    assert set(np.flatnonzero(np.isneginf(c.mask(zero)))) == run_on
    c.close()


def test_a_cached_grammar_keeps_each_requests_trigger(tok):
    """tool_choice auto and required compile the same grammar text; the compile cache must not
    hand the second request the first one's trigger (a required call left unconstrained)."""
    tools = [_tool("get", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})]
    auto = C.Constraint(C.compile_grammar(C.tool_call_grammar(tools, QWEN35, trigger=True), tok), tok)
    forced = C.Constraint(C.compile_grammar(C.tool_call_grammar(tools, QWEN35), tok), tok)
    again = C.Constraint(C.compile_grammar(C.tool_call_grammar(tools, QWEN35, trigger=True), tok), tok)
    assert (auto.active, forced.active, again.active) == (False, True, False)
    for c in (auto, forced, again):
        c.close()


def test_grammar_waits_for_the_end_of_reasoning(tok):
    spec = C.json_schema_grammar({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                  "required": ["ok"], "additionalProperties": False})
    thought = tok.encode("hmm, not JSON {{{") + [tok.token_id("</think>")]
    text, c = drive(spec, tok, seed=5, reasoning_open=True, prefix=thought)
    head, _, body = text.partition("</think>")
    assert head == "hmm, not JSON {{{"             # unmasked: the forced reasoning went through
    assert json.loads(body) in ({"ok": True}, {"ok": False})


OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}


@pytest.mark.parametrize("spelling", ["the special token", "text tokens", "text tokens and a blank line"])
def test_the_mask_starts_where_the_parser_says_reasoning_ends(tok, spelling):
    # issue 52: the mask waited for the one </think> token id while the parser splits on the text,
    # so a model spelling the marker in pieces answered unmasked
    close = {"the special token": [tok.token_id("</think>")],
             "text tokens": tok.encode_text("</think>"),
             "text tokens and a blank line": tok.encode_text("</think>\n\n")}[spelling]
    assert len(close) == 1 or tok.token_id("</think>") not in close
    thought = tok.encode_text("hmm, not JSON {{{") + close
    text, c = drive(C.json_schema_grammar(OK_SCHEMA), tok, seed=5, reasoning_open=True, prefix=thought)
    parsed = parse_output(text, tools=None, conventions=QWEN35, prompt_opens_think=True)
    assert parsed.reasoning == "hmm, not JSON {{{"
    assert json.loads(parsed.content) in ({"ok": True}, {"ok": False}), text
    assert c.masked_steps > 0


def test_while_reasoning_a_shaped_reply_can_neither_stop_nor_answer_around_the_grammar(tok):
    c = C.Constraint(C.compile_grammar(C.json_schema_grammar(OK_SCHEMA), tok), tok,
                     reasoning=ReasoningWatch(tok, QWEN35, True))
    zero = np.zeros(tok.n_vocab, dtype=np.float32)
    assert np.isneginf(c.mask(zero)[sorted(tok.eog_ids)]).all()   # stopping now would leave no answer
    for t in tok.encode_text("thinking </think"):
        c.accept(t)
    assert c.reasoning_open and not c.active
    # every token that would close the block and carry answer text past the grammar, found by
    # trying each one on the text so far
    smuggles = {i for i in range(tok.n_vocab)
                if (after := ("thinking </think" + tok.decode([i])).partition("</think>"))[1] and after[2].strip()}
    assert smuggles                                              # the vocabulary has some (">{", ...)
    assert set(np.flatnonzero(np.isneginf(c.mask(zero)))) == smuggles | set(tok.eog_ids)
    c.accept(tok.token_id("</think>"))
    assert c.active and not c.reasoning_open
    c.close()


def test_regex_and_lark_grammars(tok):
    text, _ = drive(C.regex_grammar(r"[0-9]{3}-[a-z]{2}"), tok, seed=1)
    assert len(text) == 6 and text[3] == "-" and text[:3].isdigit() and text[4:].isalpha()
    text, _ = drive(C.lark_grammar('start: "yes" | "no"'), tok, seed=2)
    assert text in ("yes", "no")
    gbnf = 'root ::= "(" [0-9]+ ")"'   # llama.cpp's GBNF form is converted
    text, _ = drive(C.lark_grammar(gbnf), tok, seed=4, max_steps=40)
    assert text.startswith("(") and (text.endswith(")") or len(text) > 30)


def test_a_construct_llguidance_rejects_is_named(tok):
    with pytest.raises(C.GrammarError) as e:
        C.compile_grammar(C.json_schema_grammar({"type": "object", "if": {"required": ["a"]}}), tok)
    assert "if" in str(e.value) and e.value.field == "response_format.json_schema.schema"
    with pytest.raises(C.GrammarError) as e:
        C.compile_grammar(C.json_schema_grammar({"type": "string", "format": "no-such-format"}), tok)
    assert "no-such-format" in str(e.value)
    with pytest.raises(C.GrammarError):
        C.compile_grammar(C.lark_grammar("start: undefined_rule"), tok)


def test_compiles_are_cached_per_grammar(tok):
    tools = [_tool(f"t{i}", {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}},
                             "required": ["q"]}) for i in range(8)]
    first = C.compile_grammar(C.tool_call_grammar(tools, QWEN35), tok)
    again = C.compile_grammar(C.tool_call_grammar(tools, QWEN35), tok)
    assert again is first
    other = C.compile_grammar(C.tool_call_grammar(tools[:3], QWEN35), tok)
    assert other is not first


def test_the_trie_names_special_tokens_and_skips_fillers(tok):
    lt = C.grammar_tokenizer(tok)
    assert C.grammar_tokenizer(tok) is lt                   # built once per vocabulary
    assert lt.vocab_size == tok.n_vocab
    assert set(lt.eos_tokens) == set(tok.eog_ids)
    # wherever <tool_call> may come, only <tool_call> may: no [PAD] filler, no byte token
    spec = C.GrammarSpec(C._from_lark("start: <tool_call>"), "test", "grammar")
    c = C.Constraint(C.compile_grammar(spec, tok), tok)
    allowed = np.flatnonzero(np.isfinite(c.mask(np.zeros(tok.n_vocab, np.float32))))
    assert allowed.tolist() == [tok.token_id("<tool_call>")]
    pads = [i for i in range(tok.n_vocab) if tok.token_type(i) == TokenType.UNUSED]
    assert pads                                             # the factory vocabulary has fillers


def _one_by_one(tok: Tokenizer) -> list[bytes]:
    return [C._trie_bytes(tok, i) for i in range(tok.n_vocab)]


def test_the_trie_bytes_built_in_bulk_are_each_tokens_own(tok, model_factory):
    """The bulk path (one table lookup over every NORMAL token's characters, cut at their lengths)
    gives each token the bytes the one-token path gives it: the factory vocabulary, Qwen3.5's
    real one (248,320 tokens), and tokens with a character outside the byte map."""
    from engine.gguf_file import GGUFFile

    real = Tokenizer.from_gguf_metadata(GGUFFile(model_factory("tiny", "F32", 0, vocab="qwen35")).metadata)
    for t in (tok, real):
        assert C._trie_tokens(t, t.token_types) == _one_by_one(t)
    meta = dict(build_vocab(4096).metadata())
    extra = ["x€y", "€", "ĠΩmega"]                      # not byte-level text: decoded one by one
    pieces = list(meta["tokenizer.ggml.tokens"]) + extra
    types = list(meta["tokenizer.ggml.token_type"]) + [TokenType.NORMAL] * len(extra)
    odd = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.tokens": pieces, "tokenizer.ggml.token_type": types})
    bulk = C._trie_tokens(odd, odd.token_types)
    assert bulk == _one_by_one(odd)
    assert bulk[-3:] == [odd.token_bytes(odd.n_vocab - 3 + k) for k in range(3)] and bulk[-1].endswith(b"mega")
