"""What a strict JSON parser accepts, for the constrained-output property tests."""
from __future__ import annotations

import json
import math


def _not_json(name):
    raise ValueError(f"{name} is not JSON")


def strict_loads(text: str):
    """What a strict parser accepts: RFC 8259 numbers that a double holds, no NaN / Infinity."""
    def finite(t):
        v = float(t)
        assert math.isfinite(v), f"{t[:30]} is no finite double"
        return v

    def fits(t):
        v = int(t)
        assert math.isfinite(float(v)) if len(t) < 310 else False, f"{t[:30]}... is no finite double"
        return v

    return json.loads(text, parse_constant=_not_json, parse_float=finite, parse_int=fits)


def integers_stay_integers(value, schema):
    """Every value an `integer` schema (on the path) admits is a JSON integer, not 3.0."""
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
    for k, sub in (schema.get("properties") or {}).items():
        if isinstance(value, dict) and k in value:
            integers_stay_integers(value[k], sub)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            integers_stay_integers(v, schema["items"])
