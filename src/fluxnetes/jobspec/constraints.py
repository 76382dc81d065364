"""RFC 31 job constraints: properties / hostlist / ranks combined with and / or / not.

Fluxion semantics (fluxion-spec §2.7): ``properties`` = each named key is present in the
vertex properties (``^name`` = must be absent; values are ignored); ``hostlist`` = vertex name
in the list; ``ranks`` = vertex rank in the idset; ``not`` = negation of the AND of its
operands; ``{}``, ``{"and": []}`` and ``{"or": []}`` match everything. The matcher applies
constraints to ``node`` and ``storage_node`` vertices only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fluxnetes.jobspec.errors import JobspecError

_BAD_PROP = set("!&'\"^`|()\\")


class _Vertexish(Protocol):
    name: str
    rank: int
    properties: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Constraint:
    op: str  # "all", "and", "or", "not", "properties", "hostlist", "ranks"
    args: tuple[Any, ...] = ()

    def match(self, v: _Vertexish) -> bool:
        op = self.op
        if op == "all":
            return True
        if op == "and":
            return all(c.match(v) for c in self.args)
        if op == "or":
            return (not self.args) or any(c.match(v) for c in self.args)
        if op == "not":
            return not all(c.match(v) for c in self.args) if self.args else False
        if op == "properties":
            props = v.properties or {}
            for p in self.args:
                if p.startswith("^"):
                    if p[1:] in props:
                        return False
                elif p not in props:
                    return False
            return True
        if op == "hostlist":
            return v.name in self.args[0]
        if op == "ranks":
            return v.rank in self.args[0]
        return False  # pragma: no cover - parse_constraint only builds the ops above


class ConstraintError(ValueError):
    pass


def _err(path: str, rule: str) -> Exception:
    return JobspecError(path, rule)


def parse_constraint(raw: Any, path: str) -> Constraint:
    if not isinstance(raw, Mapping):
        raise _err(path, "must be a mapping (RFC 31 constraint)")
    if not raw:
        return Constraint("all")
    if len(raw) != 1:
        # several keys at one level are ANDed (RFC 31 allows an implicit and)
        return Constraint("and", tuple(parse_constraint({k: v}, f"{path}") for k, v in raw.items()))
    key, val = next(iter(raw.items()))
    sub = f"{path}.{key}"
    if key in ("and", "or", "not"):
        if not isinstance(val, list):
            raise _err(sub, "must be a list of constraints")
        return Constraint(key, tuple(parse_constraint(c, f"{sub}[{i}]") for i, c in enumerate(val)))
    if key == "properties":
        if not isinstance(val, list):
            raise _err(sub, "must be a list of property names")
        for i, p in enumerate(val):
            if not isinstance(p, str) or not p:
                raise _err(f"{sub}[{i}]", "must be a non-empty string")
            name = p[1:] if p.startswith("^") else p
            if not name or any(ch in _BAD_PROP for ch in name):
                raise _err(f"{sub}[{i}]", "property names may not contain ! & ' \" ^ ` | ( ) \\")
        return Constraint("properties", tuple(val))
    if key == "hostlist":
        if not isinstance(val, list):
            raise _err(sub, "must be a list of hostlist strings")
        hosts: set[str] = set()
        for i, h in enumerate(val):
            if not isinstance(h, str):
                raise _err(f"{sub}[{i}]", "must be a string")
            try:
                hosts.update(expand_hostlist(h))
            except ValueError as exc:
                raise _err(f"{sub}[{i}]", str(exc)) from None
        return Constraint("hostlist", (frozenset(hosts),))
    if key == "ranks":
        if not isinstance(val, list):
            raise _err(sub, "must be a list of idset strings")
        ranks: set[int] = set()
        for i, r in enumerate(val):
            try:
                ranks.update(expand_idset(str(r)))
            except ValueError as exc:
                raise _err(f"{sub}[{i}]", str(exc)) from None
        return Constraint("ranks", (frozenset(ranks),))
    raise _err(sub, "unknown operator (allowed: properties, hostlist, ranks, and, or, not)")


def expand_idset(s: str) -> list[int]:
    """RFC 22 idset "0-3,7" -> [0, 1, 2, 3, 7]."""
    out: list[int] = []
    s = s.strip().strip("[]")
    if not s:
        return out
    for part in s.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"'{part}' is not an idset element (N or N-M)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise ValueError(f"'{part}': range end before start")
        out.extend(range(lo, hi + 1))
    return out


def encode_idset(ids: list[int] | set[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (sorted, ranges compressed)."""
    xs = sorted(set(ids))
    n = len(xs)
    if n and xs[-1] - xs[0] == n - 1:
        # one contiguous run (whole sockets/nodes, consecutive ranks): the common case in R
        return str(xs[0]) if n == 1 else f"{xs[0]}-{xs[-1]}"
    parts: list[str] = []
    i = 0
    while i < n:
        j = i
        while j + 1 < n and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def expand_hostlist(s: str) -> list[str]:
    """RFC 29 hostlist "node[0-2,5],login1" -> names."""
    out: list[str] = []
    for item in _split_top(s):
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
        if not m:
            if "[" in item or "]" in item:
                raise ValueError(f"'{item}' is not a valid hostlist entry")
            if item:
                out.append(item)
            continue
        prefix, body, suffix = m.groups()
        for part in body.split(","):
            rm = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if not rm:
                raise ValueError(f"'{part}' is not a hostlist range")
            lo_s, hi_s = rm.group(1), rm.group(2) or rm.group(1)
            width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
            for n in range(int(lo_s), int(hi_s) + 1):
                out.append(f"{prefix}{str(n).zfill(width)}{suffix}")
    return out


def _split_top(s: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    return items
