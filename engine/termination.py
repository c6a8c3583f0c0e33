"""Can a constraint ever finish? Schemas and grammars that have no finite answer, found before
any decoding.

A JSON schema whose ``$ref`` s form a cycle with no base case (``a`` requires a ``b`` that
requires an ``a``) and a grammar whose rules never reach an end (``start: start start``, left
recursion with no terminal) both compile in llguidance, which then masks the model along an
answer that cannot end: the reply runs to ``max_tokens`` and is cut. Both are the classic
question of which symbols of a grammar are *productive* (derive at least one finite string),
answered by a fixpoint: a symbol is productive once one of its alternatives uses productive
symbols only.

``unfinishable_schema`` and ``unfinishable_lark`` return None, or a sentence naming what cannot
finish. They only speak when sure: a construct they do not model counts as productive, and
llguidance still checks everything else (empty enums, contradicting bounds, ...).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["unfinishable_lark", "unfinishable_schema"]

_MAX_ROUNDS = 10_000


# ----------------------------------------------------------------------------- JSON schemas

def _resolve(root: Any, ref: str) -> Any:
    """The schema a local ``$ref`` points at (``#``, ``#/$defs/x``, any JSON pointer); None if it
    does not resolve here (llguidance names a dangling ref itself)."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _refs(node: Any, out: set[str], depth: int = 0) -> None:
    if depth > 200:
        return
    if isinstance(node, Mapping):
        r = node.get("$ref")
        if isinstance(r, str):
            out.add(r)
        for v in node.values():
            _refs(v, out, depth + 1)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out, depth + 1)


def _finishes(node: Any, ok: set[str], depth: int = 0) -> bool:
    """Whether `node` has a finite value, given that the refs in `ok` do."""
    if depth > 200:
        return True                       # too deep to judge: llguidance decides
    if node is False:
        return False
    if not isinstance(node, Mapping):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and ref not in ok:
        return False
    if "enum" in node or "const" in node:
        return True
    for key, need_all in (("allOf", True), ("anyOf", False), ("oneOf", False)):
        subs = node.get(key)
        if isinstance(subs, list) and subs:
            results = [_finishes(s, ok, depth + 1) for s in subs]
            if (all(results) if need_all else any(results)) is False:
                return False
    t = node.get("type")
    types = [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)] if isinstance(t, list) else None
    if types is None:
        return True                       # untyped: a null, a number or a string ends at once
    return any(_type_finishes(node, kind, ok, depth) for kind in types)


def _type_finishes(node: Mapping[str, Any], kind: str, ok: set[str], depth: int) -> bool:
    if kind == "object":
        raw_props = node.get("properties")
        props: Mapping[str, Any] = raw_props if isinstance(raw_props, Mapping) else {}
        for name in node.get("required") or []:
            if isinstance(name, str) and name in props and not _finishes(props[name], ok, depth + 1):
                return False
        return True
    if kind == "array":
        raw_need, raw_prefix = node.get("minItems"), node.get("prefixItems")
        need: int = raw_need if isinstance(raw_need, int) else 0
        prefix: list[Any] = raw_prefix if isinstance(raw_prefix, list) else []
        if any(not _finishes(s, ok, depth + 1) for s in prefix[:need]):
            return False
        if need > len(prefix) and "items" in node and not _finishes(node["items"], ok, depth + 1):
            return False
        return True
    return True


def unfinishable_schema(schema: Any) -> str | None:
    """None if `schema` has a finite value; else why not (the refs that cannot end)."""
    refs: set[str] = set()
    _refs(schema, refs)
    targets = {r: _resolve(schema, r) for r in refs}
    ok = {r for r, t in targets.items() if t is None}         # dangling: llguidance's to report
    for _ in range(_MAX_ROUNDS):
        grown = {r for r, t in targets.items() if r not in ok and _finishes(t, ok)}
        if not grown:
            break
        ok |= grown
    if _finishes(schema, ok):
        return None
    stuck = sorted(r for r in refs if r not in ok)
    if len(stuck) == 1:
        return (f"the schema has no finite value: {stuck[0]} refers back to itself with no base case (every "
                "required property or item leads back into it); make one of them optional")
    if stuck:
        return (f"the schema has no finite value: {', '.join(stuck)} refer to each other with no base case "
                "(every required property or item leads back into the cycle); make one of them optional")
    return "the schema has no finite value"


# ----------------------------------------------------------------------------- Lark grammars

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+) | (?P<nl>\n) | (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<special><\[[0-9,\-\s]*\]>|<[^<>\s]+>)
  | (?P<directive>%[a-z_]+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>-?\d+)
  | (?P<arrow>->)
  | (?P<range>\.\.)
  | (?P<punct>[:|()\[\]?*+~&{},.=@!])
""", re.X)


@dataclass
class _Tok:
    kind: str
    text: str
    line_start: bool


def _lex(text: str) -> list[_Tok] | None:
    out: list[_Tok] = []
    pos, line_start = 0, True
    while pos < len(text):
        if text.startswith("%json", pos) or text.startswith("%regex", pos) or text.startswith("%llguidance", pos):
            end = _skip_braces(text, text.find("{", pos)) if "{" in text[pos:pos + 20] else -1
            if end < 0:
                return None
            # %llguidance {options} heads a grammar (a directive); %json / %regex {...} are terminals
            kind = "directive" if text.startswith("%llguidance", pos) else "terminal"
            out.append(_Tok(kind, text[pos:end], line_start))
            pos, line_start = end, False
            continue
        m = _TOKEN.match(text, pos)
        if m is None:
            return None                   # syntax this reader does not know: no verdict
        kind = m.lastgroup or ""
        if kind == "nl":
            line_start = True
        elif kind not in ("ws", "comment"):
            out.append(_Tok(kind, m.group(), line_start))
            line_start = False
        pos = m.end()
    return out


def _skip_braces(text: str, start: int) -> int:
    """The index after the ``}`` closing the ``{`` at `start` (JSON strings skipped); -1 if none."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


# An expression: ("alt", [seq, ...]) | ("seq", [expr, ...]) | ("ref", name) | ("leaf",) | ("opt",)
Expr = tuple


@dataclass
class _Parser:
    toks: list[_Tok]
    pos: int = 0
    rules: dict[str, list[Expr]] = field(default_factory=dict)

    def peek(self) -> _Tok | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def at_header(self) -> bool:
        """A definition starts here: NAME [params] [.priority] ':' at the start of a line."""
        t = self.peek()
        if t is None or t.kind != "name" or not t.line_start:
            return False
        j = self.pos + 1
        if j < len(self.toks) and self.toks[j].text == "[":
            while j < len(self.toks) and self.toks[j].text != "]":
                j += 1
            j += 1
        if j + 1 < len(self.toks) and self.toks[j].text == "." and self.toks[j + 1].kind == "number":
            j += 2
        return j < len(self.toks) and self.toks[j].text == ":"

    def parse(self) -> None:
        while self.peek() is not None:
            t = self.peek()
            assert t is not None
            if t.kind == "directive":        # %ignore / %import lines: no rule to judge
                self.pos += 1
                while self.peek() is not None and not self.peek().line_start:  # type: ignore[union-attr]
                    self.pos += 1
                continue
            if not self.at_header():
                raise ValueError(f"unexpected {t.text!r}")
            name = t.text
            while self.toks[self.pos].text != ":":
                self.pos += 1
            self.pos += 1
            self.rules.setdefault(name, []).append(self.alternatives(top=True))

    def alternatives(self, top: bool = False) -> Expr:
        alts = [self.sequence(top)]
        while (t := self.peek()) is not None and t.text == "|":
            self.pos += 1
            alts.append(self.sequence(top))
        return ("alt", alts)

    def sequence(self, top: bool) -> Expr:
        items: list[Expr] = []
        while (t := self.peek()) is not None and t.text not in ("|", ")", "]"):
            if top and self.at_header() or t.kind == "directive" and t.line_start:
                break
            if t.kind == "arrow":            # "-> alias"
                self.pos += 2
                continue
            items.append(self.item())
        return ("seq", items)

    def item(self) -> Expr:
        atom = self.atom()
        while (t := self.peek()) is not None:
            if t.text in ("?", "*"):
                self.pos += 1
                atom = ("opt",)
            elif t.text == "+":
                self.pos += 1
            elif t.text == "~":               # item ~ n  /  item ~ n..m
                self.pos += 1
                lo = self.expect("number")
                if (r := self.peek()) is not None and r.kind == "range":
                    self.pos += 1
                    self.expect("number")
                if int(lo) == 0:
                    atom = ("opt",)
            elif t.text == "{":               # item{n} / item{n,m} / item{,m}
                self.pos += 1
                lo_tok = self.peek()
                least = int(lo_tok.text) if lo_tok is not None and lo_tok.kind == "number" else 0
                while (c := self.peek()) is not None and c.text != "}":
                    self.pos += 1
                self.pos += 1
                if least == 0:
                    atom = ("opt",)
            elif t.text == "&":               # intersection of terminals
                self.pos += 1
                atom = ("seq", [atom, self.atom()])
            else:
                break
        return atom

    def atom(self) -> Expr:
        t = self.peek()
        if t is None:
            raise ValueError("the grammar ends inside a rule")
        self.pos += 1
        if t.text == "(":
            inner = self.alternatives()
            self.expect_text(")")
            return inner
        if t.text == "[":
            self.alternatives()
            self.expect_text("]")
            return ("opt",)
        if t.text == "~":                     # negated terminal
            self.atom()
            return ("leaf",)
        if t.kind == "name":
            return ("ref", t.text)
        if t.kind == "string":
            if (r := self.peek()) is not None and r.kind == "range":
                self.pos += 1
                self.expect("string")
            return ("leaf",)
        if t.kind in ("regex", "special", "terminal"):
            return ("leaf",)
        raise ValueError(f"unexpected {t.text!r}")

    def expect(self, kind: str) -> str:
        t = self.peek()
        if t is None or t.kind != kind:
            raise ValueError(f"expected a {kind}")
        self.pos += 1
        return t.text

    def expect_text(self, text: str) -> None:
        t = self.peek()
        if t is None or t.text != text:
            raise ValueError(f"expected {text!r}")
        self.pos += 1


def _productive(e: Expr, ok: set[str], defined: set[str]) -> bool:
    kind = e[0]
    if kind == "alt":
        return any(_productive(s, ok, defined) for s in e[1])
    if kind == "seq":
        return all(_productive(s, ok, defined) for s in e[1])
    if kind == "ref":
        return e[1] in ok or e[1] not in defined     # undefined: llguidance names it
    return True


def unfinishable_lark(text: str) -> str | None:
    """None if the Lark grammar's ``start`` derives a finite string (or the grammar uses syntax
    this reader does not model); else which rules can never end."""
    toks = _lex(text)
    if toks is None:
        return None
    p = _Parser(toks)
    try:
        p.parse()
    except (ValueError, IndexError):
        return None
    if "start" not in p.rules:
        return None
    defined = set(p.rules)
    ok: set[str] = set()
    for _ in range(_MAX_ROUNDS):
        grown = {n for n, defs in p.rules.items() if n not in ok and any(_productive(d, ok, defined) for d in defs)}
        if not grown:
            break
        ok |= grown
    if "start" in ok:
        return None
    stuck = sorted(n for n in defined if n not in ok)
    names = f"rules {', '.join(stuck)} never end" if len(stuck) > 1 else f"rule {stuck[0]} never ends"
    return (f"the grammar has no finite answer: {names} (each alternative uses a rule that never ends, "
            "itself included); give one an alternative made of terminals")
