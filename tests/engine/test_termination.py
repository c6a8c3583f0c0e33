"""engine/termination.py: schemas and grammars with no finite answer are named; everything with
one (recursion with a base case, llguidance's syntax, GBNF) passes untouched."""
from __future__ import annotations

import pytest

from engine import constraints as C
from engine.models.qwen35 import CONVENTIONS as QWEN35
from engine.termination import unfinishable_lark, unfinishable_schema

CYCLE_DEFS = {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
              "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}}


@pytest.mark.parametrize("schema", [
    {"$defs": CYCLE_DEFS, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
    {"type": "array", "minItems": 1, "items": {"$ref": "#"}},
    {"definitions": {"x": {"allOf": [{"$ref": "#/definitions/x"}]}}, "$ref": "#/definitions/x"},
    {"type": "object", "properties": {"p": {"anyOf": [{"$ref": "#"}, {"$ref": "#/properties/p"}]}},
     "required": ["p"]},
    {"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1},
])
def test_schemas_with_no_finite_value_are_named(schema):
    why = unfinishable_schema(schema)
    assert why is not None and "no finite value" in why, schema


@pytest.mark.parametrize("schema", [
    {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                     "required": ["kids"]}}, "$ref": "#/$defs/n"},                      # [] ends it
    {"type": "object", "properties": {"me": {"$ref": "#"}}},                          # optional
    {"anyOf": [{"type": "array", "minItems": 1, "items": {"$ref": "#"}}, {"type": "null"}]},
    {"type": ["object", "null"], "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
    {"$defs": CYCLE_DEFS, "type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}},
    {"$ref": "#/$defs/missing"},                     # dangling: llguidance names it
    {"type": "string"}, {}, {"enum": [1, 2]},
])
def test_schemas_with_a_finite_value_pass(schema):
    assert unfinishable_schema(schema) is None, schema


@pytest.mark.parametrize("grammar", [
    "start: start start",
    'start: start "a"',
    'start: "a" b\nb: b "x"',
    "start: s\ns: \"a\" s\n",
    'start: x\nx: "(" y ")"\ny: x | "[" y "]"',
    'start: (a | b)+\na: b "x"\nb: a "y"',
])
def test_grammars_that_never_end_are_named(grammar):
    why = unfinishable_lark(grammar)
    assert why is not None and "never end" in why, grammar


@pytest.mark.parametrize("grammar", [
    'start: "yes" | "no"',
    'start: start "a" | "b"',                                  # left recursion with a base case
    'start: x+\nx: "a" | "(" x ")"',
    'start: item*\nitem[lazy]: /[a-z]+/ "\\n"',
    'start: "x" %json {"type": "object", "properties": {"a": {"type": "string"}}}',
    "start: <tool_call> \"\\n\" body </tool_call>\nbody: /[^<]+/",
    'start: A B?\nA: /[0-9]+/\nB: "." /[0-9]+/\n%ignore " "',
    'start: ("a" | "b"){2,3} c ~ 0..2\nc: "c"',
    'start.2: x -> alias\nx: NAME\nNAME: /[A-Z]/ & ~/Q/',
    'start: "a" // a comment\n    | "b"',
    "start: [maybe] \"end\"\nmaybe: maybe \"x\"",             # an optional rule that never ends
])
def test_grammars_with_an_end_pass(grammar):
    assert unfinishable_lark(grammar) is None, grammar


def test_every_grammar_warmllm_builds_passes():
    """The tool-call and schema grammars we generate ourselves must never be refused."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"},
                                         "o": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "required": ["a"]}}}]
    for spec in (C.tool_call_grammar(tools, QWEN35), C.tool_call_grammar(tools, QWEN35, trigger=True, parallel=False),
                 C.json_schema_grammar({"type": "object"}), C.choice_grammar(["a", "b"])):
        assert spec.grammar
    from llguidance.gbnf_to_lark import any_to_lark
    gbnf = 'root ::= object\nobject ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}"\n' \
           'value ::= object | string | "null"\nstring ::= "\\"" [a-z]* "\\""\nws ::= [ ]?'
    assert unfinishable_lark(any_to_lark(gbnf)) is None
    assert unfinishable_lark(any_to_lark('root ::= "a" root')) is not None
