"""GBNF for a call in a family's own format: the pieces every family's grammar is built from.

A call's arguments are held to its tool's JSON schema by llama.cpp's schema converter (llama-cpp-python's
port of json-schema-to-grammar). One grammar holds several tools' schemas, and a text-valued format one
schema a parameter, so each converted schema's rules are renamed under a prefix of their own.

A format whose values (or reasoning, or messages) are raw text between markers needs "any text its parser
reads back whole": text_without, the one automaton every family builds that from."""

import functools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from swarmtune.engine.conversation.formats.reply import ReplyContext
from swarmtune.engine.errors import UserError

if TYPE_CHECKING:
    from swarmtune.engine.conversation.formats.base import Format

_RULE = re.compile(r"^([A-Za-z0-9-]+) ::=", re.M)
# in a rule's body: a string literal, a character class, or a name (only names are renamed)
_PIECE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z][A-Za-z0-9-]*')


def literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped.replace(chr(9), chr(92) + "t")}"'


def schema_rules(schema: dict[str, Any] | None, prefix: str, string_text: str = "") -> tuple[str, str]:
    """(rules, root name): values that validate against `schema` (any JSON value without one), every rule named
    under `prefix`, their strings holding what a strict JSON parser takes back. With `string_text` (a rule
    from text_without(..., json_chars=True)), the inside of every plain JSON string (the converter's `string`
    rule: values and keys alike) is that rule instead: a format whose JSON values sit between markers must
    keep a closer out of its strings too, or the value would end there. Strings the converter writes with
    rules of their own (a pattern, a length) keep them. A schema the converter cannot express is the
    client's error, said in one line."""
    try:
        gbnf = str(json_schema_to_gbnf(json.dumps(schema if schema else {})))
    except Exception as e:  # the converter raises plain exceptions for schemas it cannot express
        raise UserError(f"a tool's parameters schema cannot be enforced: {e}", field="tools") from None
    # a JSON string holds no raw control character (json.loads refuses one; llama.cpp's converter says so
    # too, its Python port lets them through)
    gbnf = gbnf.replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')
    names = set(_RULE.findall(gbnf))

    def rename(m: re.Match[str]) -> str:
        piece = m.group(0)
        return f"{prefix}-{piece}" if piece in names else piece

    rules = "\n".join(_PIECE.sub(rename, line) for line in gbnf.strip().splitlines())
    if string_text:
        rules = rules.replace(f'"\\"" {prefix}-char* "\\""', f'"\\"" {string_text} "\\""')
    return rules, f"{prefix}-root"


def rule_name(text: str) -> str:
    """A rule name made from a tool's or a parameter's name (GBNF names are letters, digits and dashes)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def tool_parts(tools: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of each offered tool, in OpenAI's shape or bare."""
    out = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters")
        out.append((str(fn["name"]), params if isinstance(params, dict) else {"type": "object"}))
    return out


def json_call_object(tools: Sequence[dict[str, Any]], args_key: str, prefix: str = "call") -> tuple[str, str]:
    """(rules, root name): one JSON object `{"name": NAME, args_key: {...}}` naming one of the tools, its
    arguments validating against that tool's schema."""
    rules, alternatives = [], []
    for i, (name, params) in enumerate(tool_parts(tools)):
        schema = {"type": "object", "properties": {"name": {"const": name}, args_key: params},
                  "required": ["name", args_key]}
        body, root = schema_rules(schema, f"{prefix}{i}")
        rules.append(body)
        alternatives.append(root)
    return "\n".join(rules) + f"\n{prefix} ::= " + " | ".join(alternatives), prefix


def repeated(one: str, parallel: bool, between: str = '"\\n"') -> str:
    """A root of one call, or (parallel) one or more separated by `between`."""
    return f"root ::= {one}" + (f" ({between} {one})*" if parallel else "")


# --- any text that holds none of a set of closers

SPACES = None  # in a Closer: any run of blank space, none too (a parser's `\s*`)
Closer = tuple[str | None, ...]  # what ends a text: its pieces in order, each a text or SPACES
# what Python's `\s` matches, as the parsers' regexes read blank space (no character above U+3000 is blank)
BLANK = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
# a JSON string's escapes, as the schema converter writes them
_JSON_ESCAPE = '"\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
# what a JSON string holds only escaped (DEL is written raw, as json.loads takes it back, though the
# converter's own char rule refuses it: the text DeepSeek's DSML and Kimi K3 allow has always let it through)
_JSON_UNWRITTEN = '"\\' + "".join(map(chr, range(0x20)))
# what may follow an escape's backslash
_JSON_ESCAPED = frozenset('"\\/bfnrtu0123456789abcdefABCDEF')
_Atoms = tuple[str | None, ...]  # a closer spelled out: one character (or SPACES) each
_State = frozenset[tuple[int, int]]  # the closers begun: (which closer, how many of its atoms are written)


def text_without(name: str, closers: Sequence[str | Closer], *, before: str = "", then: str = "",
                 json_chars: bool = False) -> str:
    """GBNF rules, the first one `name` (the others `name-N`): any text, empty too, in which none of `closers`
    occurs, read as following `before` (the markup a parser's search for a closer starts in) and, where
    `then` is given (what the grammar writes right after the text: the closer that ends it), ending only
    where no closer begun in the text runs on into `then`, so that `then` is the first closer a parser finds.
    A closer is a text or a Closer, whose SPACES pieces stand for any run of blank space. With json_chars,
    the inside of a JSON string instead (schema_rules' string_text): its raw characters (no quote, backslash
    or control character) and its escapes, the closers ruled out of its raw text.

    A parser ends a value at the first of its closers, so a value that may hold any text must hold no closer,
    and nothing else need be ruled out: code full of `<`, or a closer half-written, is still text. The rules
    are the automaton that follows which closers the text has begun (Aho-Corasick's, built by subset
    construction: the closers are a few short markers), one rule a state, every character that begins or
    goes on with no closer in one class."""
    spelled = tuple((c,) if isinstance(c, str) else tuple(c) for c in closers)
    return _text_without(name, spelled, before, then, json_chars)


@functools.cache  # a family builds the same few for every request's grammar
def _text_without(name: str, closers: tuple[Closer, ...], before: str, then: str, json_chars: bool) -> str:
    """text_without, its closers each a Closer (a tuple: the cache's key)."""
    atoms: list[_Atoms] = [tuple(a for piece in c for a in ((SPACES,) if piece is SPACES else tuple(piece)))
                           for c in closers]
    # a closer that began with blanks would hold the same texts as the one after them, and would begin in ground
    assert atoms and all(a and a[0] is not SPACES for a in atoms), "a closer begins with a character"
    spelled = sorted({a for c in atoms for a in c if a is not SPACES})
    if json_chars:
        assert not any(c in _JSON_UNWRITTEN for c in spelled), "a JSON string holds these escaped"
        # so that an escape, whose backslash breaks off every closer, leaves the text in ground as it ends
        assert not any(c[0] in _JSON_ESCAPED for c in atoms), "no closer begins inside an escape"

    def spread(states: set[tuple[int, int]]) -> set[tuple[int, int]]:
        """`states`, and where each may be past a run of blanks (which may be empty)."""
        out: set[tuple[int, int]] = set()
        todo = list(states)
        while todo:
            p, i = todo.pop()
            if (p, i) not in out:
                out.add((p, i))
                if i < len(atoms[p]) and atoms[p][i] is SPACES:
                    todo.append((p, i + 1))
        return out

    def advance(state: set[tuple[int, int]] | _State, ch: str) -> set[tuple[int, int]]:
        """The closers begun in `state` that `ch` goes on with."""
        nxt = set()
        for p, i in state:
            if i < len(atoms[p]):
                if atoms[p][i] is SPACES and ch in BLANK:
                    nxt.add((p, i))
                elif atoms[p][i] == ch:
                    nxt.add((p, i + 1))
        return spread(nxt)

    def whole(state: set[tuple[int, int]]) -> bool:
        return any(i == len(atoms[p]) for p, i in state)

    ground = frozenset((p, 0) for p in range(len(atoms)))  # a closer may begin anywhere

    def step(state: _State, ch: str) -> _State | None:
        """The state after `ch`; None where the text then holds a whole closer."""
        nxt = advance(state, ch) | ground
        return None if whole(nxt) else frozenset(nxt)

    def may_end(state: _State) -> bool:
        """No closer begun in the text (or in `before`) is whole by the end of `then`."""
        begun = {(p, i) for p, i in state if i > 0}
        for ch in then:
            begun = advance(begun, ch)
            if whole(begun):
                return False
        return True

    # the characters fall in classes that move the automaton alike: each character a closer spells; the other
    # blanks (where a closer allows a run of them); everything else (a JSON string's unwritten ones aside)
    unwritten = _JSON_UNWRITTEN if json_chars else ""
    wildcards = any(SPACES in c for c in atoms)
    blanks = "".join(c for c in BLANK if c not in spelled and c not in unwritten) if wildcards else ""
    other = next(chr(cp) for cp in range(0xE000, 0xF900) if chr(cp) not in spelled)  # a private-use stand-in
    classes = [(ch, ch) for ch in spelled] + ([(blanks[0], blanks)] if blanks else []) + [(other, "")]

    start: _State | None = ground
    for ch in before:
        assert start is not None
        start = step(start, ch)
    assert start is not None, "the markup before a text holds no closer"
    ids = {start: 0}
    queue = [start]

    def rule(state: _State) -> str:
        if state not in ids:
            ids[state] = len(ids)
            queue.append(state)
        return name if ids[state] == 0 else f"{name}-{ids[state]}"

    lines = []
    while queue:
        state = queue.pop(0)
        groups: dict[str, list[str]] = {}  # target rule: the classes (by their stand-in) that lead there
        for rep, _ in classes:
            target = step(state, rep)
            if target is not None:
                groups.setdefault(rule(target), []).append(rep)
        alternatives = [""] if may_end(state) else []
        for target_rule, reps in groups.items():
            if other in reps:  # everything but the classes that go elsewhere (or nowhere)
                chars = "".join(members for rep, members in classes if rep not in reps) + unwritten
                alternatives.append(f"[^{_class(chars)}] {target_rule}")
            else:
                alternatives.append(f"[{_class(''.join(m for rep, m in classes if rep in reps))}] {target_rule}")
        if json_chars:
            alternatives.append(f"{_JSON_ESCAPE} {rule(ground)}")
        lines.append(f"{rule(state)} ::= " + " | ".join(alternatives))
    return "\n".join(lines)


def _class(chars: str) -> str:
    """The body of a GBNF character class holding `chars`, runs of code points as ranges."""
    cps = sorted({ord(c) for c in chars})
    out, i = [], 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        out.append(_class_char(cps[i]) + (f"-{_class_char(cps[j])}" if j > i else ""))
        i = j + 1
    return "".join(out)


def _class_char(cp: int) -> str:
    """One character in a GBNF character class; any that the class syntax gives a meaning to, escaped."""
    c = chr(cp)
    if c.isascii() and (c.isalnum() or c in "<>/=_.,:;!?@#$%&*()+{}|~'` "):
        return c
    return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}"


def hold(fmt: "Format", ctx: ReplyContext, grammar: str, triggers: tuple[str, ...],
         forced: bool) -> tuple[str, tuple[str, ...]]:
    """A call grammar and its triggers, set for where the reply starts, as llama-server sets them around a
    thinking block: a call the model drafts while thinking stays free, and the call after the block is held.
    - the prompt opened the block (`<think>\n` at its end): a lazy grammar triggers only past its close; a
      forced one (required) is held from the close on;
    - the model may open it itself: a trigger counts only past the block's close, where the reply opened one.
    A format without a thinking block keeps its own."""
    close, opened = fmt.think_close, fmt.think_open
    if not close or not opened or not ctx.reasoning:
        return grammar, triggers
    if fmt.starts_in_reasoning(ctx):
        if triggers:
            return grammar, tuple(f"^[\\s\\S]*?{re.escape(close)}[\\s\\S]*?{_grouped(t)}" for t in triggers)
        if not forced:
            return grammar, triggers
        calls = re.sub(r"^root ::=", "calls ::=", grammar, count=1, flags=re.M)
        return f"{calls}\nroot ::= {literal(close)} [ \\t\\n]* calls\n", (re.escape(close),)
    if not triggers:
        return grammar, triggers
    o, c = re.escape(opened), re.escape(close)
    return grammar, tuple(f"^(?:\\s*{o}[\\s\\S]*?{c}|(?!\\s*{o}))[\\s\\S]*?{_grouped(t)}" for t in triggers)


def _grouped(pattern: str) -> str:
    """A trigger as the group the grammar starts at (one that has its own keeps it)."""
    return pattern if "(" in pattern else f"({pattern})"
