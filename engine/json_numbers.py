"""Numbers every strict JSON parser accepts, in what the model writes under a schema and in what
the XML tool-call parser converts.

RFC 8259 has no Infinity or NaN, and a number a double cannot hold (``1e999``, a 400-digit
integer) becomes Infinity in the parsers that read it as a double (Python's ``json``,
JavaScript's ``JSON.parse``), and then cannot be written back as JSON. llguidance's JSON number
is the RFC's lexeme with no bound on digits or exponent, so the model could write ``1e999``.
``finite_schema`` bounds every place of a schema where a number can go:

- a node that admits numbers gets ``minimum`` / ``maximum`` (narrowed to ``NUMBER_LIMIT``, or
  ``INTEGER_LIMIT`` for ``integer``, when the schema sets wider or none). llguidance writes a
  bounded number as plain decimals (no exponent), within the bounds: always a finite double,
  and an ``integer`` has no fraction or exponent at all;
- a place where any value may go (no ``items``, no ``additionalProperties``, ``true``, ``{}``)
  gets a recursive "any JSON with finite numbers" definition instead.

``loads_finite`` is the strict reader for model text the grammar did not write (a parameter
with no schema): RFC numbers only, finite doubles only.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["INTEGER_LIMIT", "NUMBER_LIMIT", "finite_schema", "loads_finite"]

# llguidance builds its bounded-number regex on 64-bit integers: 1e18 is within them and far
# beyond any argument a tool takes as a plain decimal. Integers: I-JSON's (RFC 7493, 2.2), the
# ones a double holds exactly, so a JavaScript client reads back the integer that was written.
NUMBER_LIMIT = 1e18
INTEGER_LIMIT = 2 ** 53 - 1
_ANY = "__warmllm_finite_json"
_ANY_REF = {"$ref": f"#/$defs/{_ANY}"}
_ANY_DEF = {"minimum": -NUMBER_LIMIT, "maximum": NUMBER_LIMIT, "items": _ANY_REF,
            "additionalProperties": _ANY_REF}

# keywords whose value is one schema / a list of schemas / a map of name -> schema
# (not `not` or `if`: bounding a schema there would widen what the whole admits)
_ONE = ("items", "additionalProperties", "then", "else", "contains", "unevaluatedItems",
        "unevaluatedProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _types(node: Mapping[str, Any]) -> set[str] | None:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return None            # untyped: every type


def _bound(node: dict[str, Any], limit: float) -> None:
    lo, hi = node.get("minimum"), node.get("maximum")
    if not isinstance(lo, (int, float)) or isinstance(lo, bool) or lo < -limit:
        node["minimum"] = -limit
    if not isinstance(hi, (int, float)) or isinstance(hi, bool) or hi > limit:
        node["maximum"] = limit


def _walk(node: Any) -> Any:
    if node is True:
        return dict(_ANY_REF)
    if not isinstance(node, Mapping):
        return node                     # False, or not a schema: llguidance says what is wrong
    out = dict(node)
    for key in _ONE:
        if key in out and not (key == "items" and isinstance(out[key], list)):
            out[key] = _walk(out[key])
        elif key == "items" and isinstance(out.get(key), list):       # draft-4 tuple form
            out[key] = [_walk(s) for s in out[key]]
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_walk(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _walk(s) for k, s in out[key].items()}
    types = _types(out)
    combined = any(k in out for k in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const"))
    if not combined:
        # a leaf that may be a number: bound it (minimum/maximum only ever apply to numbers)
        if types is None or "number" in types:
            _bound(out, NUMBER_LIMIT)
        elif "integer" in types:
            _bound(out, INTEGER_LIMIT)
        if (types is None or "array" in types) and "items" not in out and "prefixItems" not in out:
            out["items"] = dict(_ANY_REF)
        if (types is None or "object" in types) and "additionalProperties" not in out:
            out["additionalProperties"] = dict(_ANY_REF)
    return out


def finite_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with every number it admits bounded to a finite double (module doc). The caller's
    schema is not modified."""
    out = _walk(schema)
    defs = dict(out.get("$defs") or {})
    defs[_ANY] = _ANY_DEF
    out["$defs"] = defs
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:20]}... does not fit a double")
    return v


def _finite_int(text: str) -> int:
    v = int(text)        # ValueError past Python's 4,300 digits
    try:
        float(v)
    except OverflowError:
        raise ValueError("an integer that does not fit a double") from None
    return v


def loads_finite(text: str) -> Any:
    """``json.loads`` holding to RFC 8259 and finite doubles: no NaN / Infinity, no number a double
    cannot hold. ValueError otherwise (RecursionError for text nested too deep)."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_finite_int)
