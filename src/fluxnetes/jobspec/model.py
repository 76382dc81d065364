"""Jobspec model (RFC 14 canonical / RFC 25 V1, as Fluxion accepts them) and its validation.

Parsing follows Fluxion's own parser (fluxion-spec §2.3) where it is stricter than RFC 14
(integer or dict counts only, ``label`` mandatory on slots, at most these resource keys) and
RFC 25 for ``version: 1`` documents (node/slot/core/gpu shapes only, one task).
Every error names the path of the offending field and the rule it broke.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from fluxnetes.jobspec.constraints import Constraint, parse_constraint
from fluxnetes.jobspec.errors import (
    JobspecError as JobspecError,  # re-exported: callers import it from here
)
from fluxnetes.jobspec.fastyaml import load_simple

UINT_MAX = 4294967295
_SAFE_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_RESOURCE_KEYS = frozenset({"type", "count", "unit", "exclusive", "with", "label", "id"})
_TOP_KEYS = ("version", "resources", "tasks", "attributes")


@dataclass(frozen=True, slots=True)
class Count:
    """Fluxion count: fixed N is min=max=N, '+', 1; ``{min}`` alone means max=UINT_MAX."""

    min: int
    max: int
    operator: str = "+"
    operand: int = 1


@dataclass(slots=True)
class Resource:
    type: str
    count: Count
    unit: str = ""
    exclusive: bool | None = None  # tristate: None = unspecified
    with_: list[Resource] = field(default_factory=list)
    label: str = ""
    id: str = ""
    # per-ONE-resource requirement of every type in the subtree below (Fluxion's
    # prime_jobspec user_data, computed for all types; the matcher keeps tracked ones)
    agg: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Task:
    command: list[str]
    slot: str
    count: dict[str, Any]
    distribution: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Jobspec:
    version: int
    resources: list[Resource]
    tasks: list[Task]
    attributes: dict[str, Any]
    duration: int = 0  # whole seconds (ceil), 0 = unset / unknown
    constraint: Constraint | None = None
    queue: str = ""
    # total requirement per type of the whole request (Fluxion's dfv), all types
    totals: dict[str, int] = field(default_factory=dict)
    types: frozenset[str] = frozenset()
    # labels of the pod sets when the request holds several slot-holding siblings (a
    # multi-role gang: see fluxnetes.jobspec.podsets); empty for every Fluxion-shaped request
    sets: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Canonical mapping form (what parse_jobspec accepts back)."""

        def res(r: Resource) -> dict[str, Any]:
            d: dict[str, Any] = {"type": r.type}
            c = r.count
            if c.min == c.max and c.operator == "+" and c.operand == 1:
                d["count"] = c.min
            elif c.max == UINT_MAX and c.operator == "+" and c.operand == 1:
                d["count"] = {"min": c.min}
            else:
                d["count"] = {"min": c.min, "max": c.max, "operator": c.operator,
                              "operand": c.operand}
            if r.unit:
                d["unit"] = r.unit
            if r.exclusive is not None:
                d["exclusive"] = r.exclusive
            if r.label:
                d["label"] = r.label
            if r.id:
                d["id"] = r.id
            if r.with_:
                d["with"] = [res(w) for w in r.with_]
            return d

        tasks = []
        for t in self.tasks:
            td: dict[str, Any] = {"command": list(t.command), "slot": t.slot, "count": dict(t.count)}
            if t.distribution:
                td["distribution"] = t.distribution
            if t.attributes:
                td["attributes"] = t.attributes
            tasks.append(td)
        return {"version": self.version, "resources": [res(r) for r in self.resources],
                "tasks": tasks, "attributes": self.attributes}

    def to_yaml(self) -> str:
        # libyaml's emitter when PyYAML has it: the same text, ~10x faster (the operator writes
        # a jobspec per group)
        return str(yaml.dump(self.to_dict(), Dumper=_SAFE_DUMPER, sort_keys=False))


# ----------------------------------------------------------------------------- parsing

_CACHE: dict[str, Jobspec] = {}
_CACHE_MAX = 256


def parse_jobspec(source: str | bytes | Mapping[str, Any]) -> Jobspec:
    """Parse and validate a jobspec from YAML/JSON text or an already-loaded mapping.

    Text inputs are cached by their exact text (a parsed Jobspec is treated as immutable by
    the matcher), so re-submitting the same request text costs a dict lookup.
    """
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if isinstance(source, str):
        hit = _CACHE.get(source)
        if hit is not None:
            return hit
        data = _load_text(source)
        js = _build(data)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[source] = js
        return js
    if isinstance(source, Mapping):
        return _build(source)
    raise JobspecError("jobspec", "must be YAML/JSON text or a mapping")


def _load_text(text: str) -> Any:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML is a superset for flow style; let it report
    # common small block shapes without PyYAML's Python-level construction (same result;
    # anything outside the subset, including every error, goes to PyYAML below)
    simple = load_simple(text)
    if simple is not None:
        return simple
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobspecError("jobspec", f"is not valid YAML/JSON: {problem}{where}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _build(data: Any) -> Jobspec:
    if not isinstance(data, Mapping):
        raise JobspecError("jobspec", "must be a mapping with version, resources, tasks, attributes")
    for k in data:
        if k not in _TOP_KEYS:
            raise JobspecError(str(k), "unknown top-level key (allowed: version, resources, tasks, attributes)")
    for k in ("version", "resources"):
        if k not in data:
            raise JobspecError(k, "is required")
    version = data["version"]
    if not _is_int(version) or not 1 <= version <= 9999:
        raise JobspecError("version", "must be an integer in 1..9999")
    resources_raw = data["resources"]
    if not isinstance(resources_raw, list) or not resources_raw:
        raise JobspecError("resources", "must be a non-empty list")
    resources = [_resource(r, f"resources[{i}]", version) for i, r in enumerate(resources_raw)]
    tasks_raw = data.get("tasks", [])
    if "tasks" not in data:
        raise JobspecError("tasks", "is required")
    if not isinstance(tasks_raw, list):
        raise JobspecError("tasks", "must be a list")
    tasks = [_task(t, f"tasks[{i}]") for i, t in enumerate(tasks_raw)]
    attrs_raw = data.get("attributes")
    if "attributes" not in data and version == 1:
        raise JobspecError("attributes", "is required")
    attributes: dict[str, Any] = {}
    if attrs_raw is not None:
        if not isinstance(attrs_raw, Mapping):
            raise JobspecError("attributes", "must be a mapping")
        for k in attrs_raw:
            if k not in ("user", "system"):
                raise JobspecError(f"attributes.{k}", "unknown key (allowed: user, system)")
        attributes = dict(attrs_raw)
    system = attributes.get("system") or {}
    if not isinstance(system, Mapping):
        raise JobspecError("attributes.system", "must be a mapping")
    duration = 0
    if "duration" in system:
        d = system["duration"]
        if isinstance(d, bool) or not isinstance(d, int | float):
            raise JobspecError("attributes.system.duration", "must be a number of seconds")
        if math.isnan(d) or d < 0:
            raise JobspecError("attributes.system.duration", "must be >= 0")
        if math.isinf(d):
            raise JobspecError("attributes.system.duration", "must be finite")
        duration = math.ceil(d)
    elif version == 1:
        raise JobspecError("attributes.system.duration", "is required for version 1")
    queue = system.get("queue", "")
    if not isinstance(queue, str):
        raise JobspecError("attributes.system.queue", "must be a string")
    constraint = None
    if "constraints" in system:
        constraint = parse_constraint(system["constraints"], "attributes.system.constraints")
    if version == 1:
        _check_v1(resources, tasks)
    for i, r in enumerate(resources):
        _check_slots(r, f"resources[{i}]", False)
    _check_siblings(resources, "resources")
    totals: dict[str, int] = {}
    types: set[str] = set()
    for r in resources:
        _prime(r, types)
        totals[r.type] = totals.get(r.type, 0) + r.count.min
        for t, n in r.agg.items():
            totals[t] = totals.get(t, 0) + r.count.min * n
    split = split_sets(resources)
    sets = tuple(_slot_labels(e)[0] for e in split[1]) if split is not None else ()
    return Jobspec(version=version, resources=resources, tasks=tasks, attributes=attributes,
                   duration=duration, constraint=constraint, queue=queue, totals=totals,
                   types=frozenset(types), sets=sets)


def _slot_labels(r: Resource) -> list[str]:
    """Labels of every slot at or under ``r`` (pre-order)."""
    if r.type == "slot":
        return [r.label]
    out: list[str] = []
    for c in r.with_:
        out.extend(_slot_labels(c))
    return out


def _set_entries(rs: list[Resource]) -> bool:
    """Several siblings, each holding exactly one slot, all slot labels distinct: pod sets of
    one gang (Fluxion's traverser refuses such siblings; fluxnetes matches them together)."""
    if len(rs) < 2:
        return False
    labels: list[str] = []
    for r in rs:
        mine = _slot_labels(r)
        if len(mine) != 1:
            return False
        labels.extend(mine)
    return len(set(labels)) == len(labels)


def split_sets(resources: list[Resource]) -> tuple[list[Resource], list[Resource]] | None:
    """(wrappers, entries) of a multi-set request: ``entries`` are the pod-set siblings, and
    ``wrappers`` the chain of single resources above them (e.g. ``rack[1]`` for a packed
    gang; empty when the sets are at the top). None for an ordinary request."""
    wrappers: list[Resource] = []
    level = resources
    while True:
        if _set_entries(level):
            return wrappers, level
        if len(level) != 1 or level[0].type == "slot":
            return None
        wrappers.append(level[0])
        level = level[0].with_


def _prime(r: Resource, types: set[str]) -> None:
    types.add(r.type)
    agg: dict[str, int] = {}
    for c in r.with_:
        _prime(c, types)
        agg[c.type] = agg.get(c.type, 0) + c.count.min
        for t, n in c.agg.items():
            agg[t] = agg.get(t, 0) + c.count.min * n
    r.agg = agg


def _count(raw: Any, path: str) -> Count:
    if _is_int(raw):
        if raw < 1:
            raise JobspecError(path, "must be >= 1")
        return Count(raw, raw)
    if isinstance(raw, str):
        raise JobspecError(path, "must be an integer or a mapping {min, max, operator, operand} "
                                 "(idset/range strings are not supported)")
    if not isinstance(raw, Mapping):
        raise JobspecError(path, "must be an integer or a mapping {min, max, operator, operand}")
    for k in raw:
        if k not in ("min", "max", "operator", "operand"):
            raise JobspecError(f"{path}.{k}", "unknown key (allowed: min, max, operator, operand)")
    if "min" not in raw:
        raise JobspecError(f"{path}.min", "is required")
    mn = raw["min"]
    if not _is_int(mn):
        raise JobspecError(f"{path}.min", "must be an integer")
    if mn < 1:
        raise JobspecError(f"{path}.min", "must be >= 1")
    present = [k for k in ("max", "operator", "operand") if k in raw]
    if present and len(present) != 3:
        missing = [k for k in ("max", "operator", "operand") if k not in raw]
        raise JobspecError(f"{path}.{missing[0]}", "is required when any of max, operator, operand is given")
    if not present:
        return Count(mn, UINT_MAX)
    mx, op, operand = raw["max"], raw["operator"], raw["operand"]
    if not _is_int(mx):
        raise JobspecError(f"{path}.max", "must be an integer")
    if mx < mn:
        raise JobspecError(f"{path}.max", "must be >= min")
    if op not in ("+", "*", "^"):
        raise JobspecError(f"{path}.operator", "must be one of '+', '*', '^'")
    if not _is_int(operand):
        raise JobspecError(f"{path}.operand", "must be an integer")
    if op == "+" and operand < 1:
        raise JobspecError(f"{path}.operand", "must be >= 1 for operator '+'")
    if op in ("*", "^") and operand < 2:
        raise JobspecError(f"{path}.operand", f"must be >= 2 for operator '{op}'")
    if op == "^" and mn < 2:
        raise JobspecError(f"{path}.min", "must be >= 2 for operator '^'")
    return Count(mn, mx, op, operand)


def _bool(raw: Any, path: str) -> bool:
    if isinstance(raw, bool):
        return bool(raw)
    if raw in ("true", "false"):
        return bool(raw == "true")
    raise JobspecError(path, "must be a boolean")


def _resource(raw: Any, path: str, version: int) -> Resource:
    if not isinstance(raw, Mapping):
        raise JobspecError(path, "must be a mapping")
    for k in raw:
        if k not in _RESOURCE_KEYS:
            raise JobspecError(f"{path}.{k}", "unknown key (allowed: type, count, unit, exclusive, with, label, id)")
    if "type" not in raw:
        raise JobspecError(f"{path}.type", "is required")
    rtype = raw["type"]
    if not isinstance(rtype, str) or not rtype:
        raise JobspecError(f"{path}.type", "must be a non-empty string")
    if "count" not in raw:
        raise JobspecError(f"{path}.count", "is required")
    count = _count(raw["count"], f"{path}.count")
    unit = raw.get("unit", "")
    if not isinstance(unit, str):
        raise JobspecError(f"{path}.unit", "must be a string")
    exclusive = None
    if "exclusive" in raw:
        exclusive = _bool(raw["exclusive"], f"{path}.exclusive")
    label = raw.get("label", "")
    if not isinstance(label, str):
        raise JobspecError(f"{path}.label", "must be a string")
    if rtype == "slot" and not label:
        raise JobspecError(f"{path}.label", "is required for type slot")
    rid = raw.get("id", "")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise JobspecError(f"{path}.id", "must be a string")
    with_: list[Resource] = []
    if "with" in raw:
        w = raw["with"]
        if not isinstance(w, list) or not w:
            raise JobspecError(f"{path}.with", "must be a non-empty list")
        with_ = [_resource(c, f"{path}.with[{i}]", version) for i, c in enumerate(w)]
    if rtype == "slot" and not with_:
        raise JobspecError(f"{path}.with", "is required for type slot")
    return Resource(rtype, count, unit, exclusive, with_, label, str(rid))


def _check_slots(r: Resource, path: str, in_slot: bool) -> None:
    if in_slot and r.exclusive is False:
        raise JobspecError(f"{path}.exclusive", "must not be false inside a slot (slot contents are exclusive)")
    inner = in_slot or r.type == "slot"
    for i, c in enumerate(r.with_):
        _check_slots(c, f"{path}.with[{i}]", inner)
    _check_siblings(r.with_, f"{path}.with")


def _check_siblings(rs: list[Resource], path: str) -> None:
    if _set_entries(rs):
        return  # pod sets: each sibling holds one slot of its own label
    seen: set[str] = set()
    has_slot = False
    for i, r in enumerate(rs):
        if r.type in seen:
            raise JobspecError(f"{path}[{i}].type", f"siblings may not request the same type '{r.type}'")
        seen.add(r.type)
        has_slot = has_slot or r.type == "slot"
    if has_slot and len(rs) > 1:
        raise JobspecError(path, "a slot may not have siblings at the same level")


def _task(raw: Any, path: str) -> Task:
    if not isinstance(raw, Mapping):
        raise JobspecError(path, "must be a mapping")
    for k in raw:
        if k not in ("command", "slot", "count", "distribution", "attributes"):
            raise JobspecError(f"{path}.{k}", "unknown key (allowed: command, slot, count, distribution, attributes)")
    if "command" not in raw:
        raise JobspecError(f"{path}.command", "is required")
    cmd = raw["command"]
    if isinstance(cmd, str):
        cmd = [cmd]
    if not isinstance(cmd, list):
        raise JobspecError(f"{path}.command", "must be a list of strings")
    if "slot" not in raw:
        raise JobspecError(f"{path}.slot", "is required")
    slot = raw["slot"]
    if not isinstance(slot, str):
        raise JobspecError(f"{path}.slot", "must be a string")
    count = raw.get("count", {"per_slot": 1})
    if not isinstance(count, Mapping) or len(count) != 1:
        raise JobspecError(f"{path}.count", "must be a mapping with exactly one of per_slot, per_resource, total")
    key = next(iter(count))
    if key not in ("per_slot", "per_resource", "total"):
        raise JobspecError(f"{path}.count.{key}", "unknown key (allowed: per_slot, per_resource, total)")
    if key != "per_resource" and (not _is_int(count[key]) or count[key] < 1):
        raise JobspecError(f"{path}.count.{key}", "must be an integer >= 1")
    dist = raw.get("distribution", "")
    attrs = raw.get("attributes", {}) or {}
    return Task([str(c) for c in cmd], slot, dict(count), str(dist), dict(attrs))


def _check_v1(resources: list[Resource], tasks: list[Task]) -> None:
    if len(resources) != 1:
        raise JobspecError("resources", "version 1 requires exactly one top-level resource")
    top = resources[0]

    def fixed(r: Resource, path: str) -> None:
        if r.count.min != r.count.max or r.count.operator != "+" or r.count.operand != 1:
            raise JobspecError(f"{path}.count", "version 1 requires a plain integer count")

    def slot_shape(s: Resource, path: str) -> None:
        fixed(s, path)
        kinds = [c.type for c in s.with_]
        if kinds not in (["core"], ["core", "gpu"], ["gpu", "core"]):
            raise JobspecError(f"{path}.with", "version 1 slots hold core, or core and gpu")
        for i, c in enumerate(s.with_):
            fixed(c, f"{path}.with[{i}]")
            if c.with_:
                raise JobspecError(f"{path}.with[{i}].with", "version 1 core/gpu have no children")

    if top.type == "node":
        fixed(top, "resources[0]")
        if len(top.with_) != 1 or top.with_[0].type != "slot":
            raise JobspecError("resources[0].with", "version 1 node holds exactly one slot")
        slot_shape(top.with_[0], "resources[0].with[0]")
    elif top.type == "slot":
        slot_shape(top, "resources[0]")
    else:
        raise JobspecError("resources[0].type", "version 1 top-level resource must be node or slot")
    if len(tasks) != 1:
        raise JobspecError("tasks", "version 1 requires exactly one task")


def exclusive_types(resources: list[Resource]) -> set[str]:
    """The resource types a request asks for exclusively (anywhere in its tree)."""
    out: set[str] = set()
    stack = list(resources)
    while stack:
        r = stack.pop()
        if r.exclusive is True:
            out.add(r.type)
        stack.extend(r.with_)
    return out
