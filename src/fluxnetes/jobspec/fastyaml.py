"""A small, strict block-YAML reader for the common jobspec shapes (a fast path before PyYAML).

Uncached ``yaml.load`` costs ~0.1 ms even with ``CSafeLoader`` (construction and implicit
scalar resolution run in Python), more than matching a one-core request. Most jobspecs are a
few dozen lines of block mappings and sequences holding names, integers, booleans and short
flow lists. ``load_simple`` reads exactly that subset and returns ``None`` for anything else
(anchors, tags, multi-line or quoted-with-escapes scalars, tabs, documents markers, words that
YAML 1.1 resolves specially such as ``yes``/``on``, duplicate keys, odd indentation...), so the
caller falls back to PyYAML, which then gives the answer *or the error message* it always gave.
Whatever it does return equals what ``yaml.load(text, Loader=CSafeLoader)`` returns (same
values and types; tests compare both on generated documents).
"""

from __future__ import annotations

import re
from typing import Any

# a plain key: starts with a letter or '_' (so never an int, float or timestamp)
_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*):(?: +(.*))?$")
# plain scalars we resolve ourselves; anything else goes to PyYAML
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+$")
_WORD = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*$")
# printable ASCII only (PyYAML rejects some control characters, folds line breaks)
_QUOTED = re.compile(r"\"([ !#-\[\]-~]*)\"$|'([ -&(-~]*)'$")
_TRUE = frozenset({"true", "True", "TRUE"})
_FALSE = frozenset({"false", "False", "FALSE"})
_NULL = frozenset({"null", "Null", "NULL"})
# YAML 1.1 words with a special meaning in some spelling: leave every spelling to PyYAML
_SPECIAL = frozenset({"yes", "no", "on", "off", "true", "false", "null", "y", "n"})
# tabs, other line breaks (YAML also breaks lines at NEL, LS, PS), BOM, NUL
_BAD_CHARS = ("\t", "\r", "\x85", "\u2028", "\u2029", "\ufeff", "\x00")


class _Unsupported(Exception):
    """Outside the subset: let PyYAML read the text."""


def load_simple(text: str) -> Any | None:
    """The document of ``text`` if it lies in the supported subset, else ``None``.

    ``None`` never means a YAML null document: an empty or comment-only text is left to
    PyYAML too.
    """
    for ch in _BAD_CHARS:
        if ch in text:
            return None
    try:
        lines = _lines(text)
        if not lines:
            return None
        value, pos = _block(lines, 0, lines[0][0])
        if pos != len(lines):
            return None
        return value
    except _Unsupported:
        return None


def _lines(text: str) -> list[tuple[int, str]]:
    """(indent, content) per meaningful line; ``- x`` becomes a dash line plus ``x`` indented."""
    out: list[tuple[int, str]] = []
    for raw in text.split("\n"):
        content = raw.lstrip(" ")
        if not content or content[0] == "#":
            continue
        if "#" in content:
            cut = content.find(" #")
            if cut < 0 or "'" in content[:cut] or '"' in content[:cut]:
                raise _Unsupported
            content = content[:cut]
        content = content.rstrip(" ")
        indent = len(raw) - len(raw.lstrip(" "))
        while content == "-" or content.startswith("- "):
            out.append((indent, "-"))
            rest = content[1:].lstrip(" ")
            if not rest:
                content = ""
                break
            indent += len(content) - len(rest)
            content = rest
        if content:
            out.append((indent, content))
    return out


def _block(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[Any, int]:
    content = lines[pos][1]
    if content == "-":
        return _seq(lines, pos, indent)
    if _KEY.match(content):
        return _map(lines, pos, indent)
    return _scalar(content), pos + 1


def _seq(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    n = len(lines)
    while pos < n and lines[pos][0] == indent and lines[pos][1] == "-":
        pos += 1
        if pos < n and lines[pos][0] > indent:
            item, pos = _block(lines, pos, lines[pos][0])
        else:
            item = None
        items.append(item)
    if pos < n and lines[pos][0] > indent:
        raise _Unsupported
    return items, pos


def _map(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    n = len(lines)
    while pos < n and lines[pos][0] == indent:
        m = _KEY.match(lines[pos][1])
        if m is None:
            raise _Unsupported
        key, rest = m.group(1), m.group(2)
        if key in out or key.lower() in _SPECIAL:
            raise _Unsupported
        pos += 1
        value: Any
        if rest:
            value = _flow_or_scalar(rest)
        elif pos < n and lines[pos][0] > indent:
            value, pos = _block(lines, pos, lines[pos][0])
        elif pos < n and lines[pos][0] == indent and lines[pos][1] == "-":
            value, pos = _seq(lines, pos, indent)
        else:
            value = None
        out[key] = value
    if pos < n and lines[pos][0] > indent:
        raise _Unsupported
    return out, pos


def _flow_or_scalar(s: str) -> Any:
    if s[0] == "[":
        if s[-1] != "]":
            raise _Unsupported
        inner = s[1:-1].strip(" ")
        if not inner:
            return []
        return [_scalar(item.strip(" ")) for item in inner.split(",")]
    return _scalar(s)


def _scalar(s: str) -> Any:
    if not s:
        raise _Unsupported
    q = _QUOTED.match(s)
    if q is not None:
        return q.group(1) if q.group(1) is not None else q.group(2)
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    if _WORD.match(s):
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        if s in _NULL:
            return None
        if s.lower() in _SPECIAL:
            raise _Unsupported
        return s
    raise _Unsupported
