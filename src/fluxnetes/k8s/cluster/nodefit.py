"""Which nodes a pod may run on, by the pod's own rules (Kubernetes' semantics, pure).

The matcher only knows resources; a pod also says *where* it may run, and kube-scheduler (which
binds the pods fluxnetes pins, see ``placement``) and the kubelet enforce that. A node the
matcher picks against those rules would leave the pod Pending forever. The rules, as the
scheduler's NodeAffinity and TaintToleration filters apply them:

* ``spec.nodeSelector``: every key is a node label with exactly that value;
* ``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``: its
  ``nodeSelectorTerms`` are ORed; within a term every ``matchExpressions`` entry (on labels) and
  every ``matchFields`` entry (only ``metadata.name``) must hold; a term with neither matches
  nothing, and so does a term with an unknown operator. Operators: ``In`` (label present, value
  listed), ``NotIn`` (label absent or value not listed), ``Exists``, ``DoesNotExist``, ``Gt`` /
  ``Lt`` (label present, both sides base-10 int64, strict comparison);
* taints with effect ``NoSchedule`` or ``NoExecute`` must each be tolerated by one of
  ``spec.tolerations``: the toleration's effect is empty or equal, its key is empty or equal,
  and its operator is ``Exists`` or ``Equal``/empty with an equal value (an empty key with
  ``Exists`` tolerates every taint). Other operators (the feature-gated ``Lt``/``Gt``) tolerate
  nothing, as with the gate off.

Soft rules (``PreferNoSchedule``, preferred affinity) never exclude a node and are ignored.

For the matcher, the eligible nodes become an RFC 31 ``hostlist`` constraint in the group's
jobspec (``constrain``); the original constraint, if any, is kept under ``attributes.system.
nodefit`` so that ``unconstrained`` gives the jobspec back exactly (recomputed when nodes change).
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fluxnetes.jobspec.constraints import encode_idset
from fluxnetes.jobspec.model import Jobspec, parse_jobspec

HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# taints the node lifecycle controller / kubelet / cloud provider set and lift as the node's
# condition changes (cordon, NotReady, pressure, not yet initialised): the graph's up/down
# status of the node stands for them, and treating them as a node's permanent property would
# turn a short outage into "can never run"
CONDITION_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
SYSTEM_KEY = "nodefit"  # attributes.system key recording what ``constrain`` added
_INT64 = re.compile(r"^[+-]?[0-9]+$")
_NUMBERED = re.compile(r"^(.*?)(0|[1-9][0-9]*)$")


# ------------------------------------------------------------------ the rules
def _int64(s: object) -> int | None:
    """Go's strconv.ParseInt(s, 10, 64), or None."""
    if not isinstance(s, str) or not _INT64.match(s):
        return None
    v = int(s)
    return v if -(2**63) <= v < 2**63 else None


def requirement_matches(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement (``key``, ``operator``, ``values``) against a label (or
    field) set; an unknown operator matches nothing."""
    key, op = req.get("key"), req.get("operator")
    wanted = [str(v) for v in req.get("values") or []]
    present = key in values
    if op == "In":
        return present and values[str(key)] in wanted
    if op == "NotIn":
        return not present or values[str(key)] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(wanted) != 1:
            return False
        have, bound = _int64(values[str(key)]), _int64(wanted[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """One NodeSelectorTerm: all expressions (labels) and all fields (metadata.name) hold; an
    empty term matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    node_fields = {"metadata.name": name}
    return all(requirement_matches(r, labels) for r in exprs) and \
        all(requirement_matches(r, node_fields) for r in fields)


def required_affinity(pod_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's required node selector (None: it has none)."""
    na = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    return req if isinstance(req, Mapping) else None


def selector_matches(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items())


def affinity_matches(pod_spec: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    req = required_affinity(pod_spec)
    if req is None:
        return True
    return any(term_matches(t, labels, name) for t in req.get("nodeSelectorTerms") or [])


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def is_condition_taint(taint: Mapping[str, Any]) -> bool:
    return str(taint.get("key") or "").startswith(CONDITION_TAINT_PREFIXES)


def hard_taints(node: Mapping[str, Any], *, conditions: bool = True) -> list[Mapping[str, Any]]:
    """The node's NoSchedule/NoExecute taints (``conditions=False``: without condition taints)."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("effect") in HARD_EFFECTS and (conditions or not is_condition_taint(t))]


def untolerated_taint(pod_spec: Mapping[str, Any], node: Mapping[str, Any], *,
                      conditions: bool = True) -> Mapping[str, Any] | None:
    tols = pod_spec.get("tolerations") or []
    for taint in hard_taints(node, conditions=conditions):
        if not any(tolerates(t, taint) for t in tols):
            return taint
    return None


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def why_not(pod_spec: Mapping[str, Any], node: Mapping[str, Any], *, conditions: bool = True) -> str | None:
    """The first rule of the pod that ``node`` breaks ("nodeSelector", "affinity" or "taint
    k=v:Effect"), or None if the pod may run there."""
    labels = _labels(node)
    if not selector_matches(pod_spec, labels):
        return "nodeSelector"
    if not affinity_matches(pod_spec, labels, _name(node)):
        return "affinity"
    taint = untolerated_taint(pod_spec, node, conditions=conditions)
    if taint is not None:
        return f"taint {taint_text(taint)}"
    return None


def eligible(pod_spec: Mapping[str, Any], node: Mapping[str, Any], *, conditions: bool = True) -> bool:
    """May a pod with ``pod_spec`` be scheduled on ``node`` by its node rules? (``conditions=
    False`` leaves out the taints that stand for the node's condition, see above.)"""
    return why_not(pod_spec, node, conditions=conditions) is None


# ------------------------------------------------------------------ texts
def taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key', '')}{'=' + str(value) if value else ''}:{taint.get('effect', '')}"


def selector_text(pod_spec: Mapping[str, Any]) -> str:
    sel = pod_spec.get("nodeSelector") or {}
    return "nodeSelector " + ",".join(f"{k}={v}" for k, v in sorted(sel.items()))


def _req_text(r: Mapping[str, Any]) -> str:
    vals = ",".join(str(v) for v in r.get("values") or [])
    return f"{r.get('key')} {r.get('operator')}" + (f" ({vals})" if vals else "")


def affinity_text(pod_spec: Mapping[str, Any]) -> str:
    terms = (required_affinity(pod_spec) or {}).get("nodeSelectorTerms") or []
    parts = []
    for t in terms:
        reqs = [*(t.get("matchExpressions") or []), *(t.get("matchFields") or [])]
        parts.append(" and ".join(_req_text(r) for r in reqs) or "(empty term)")
    return "required node affinity " + (" or ".join(f"[{p}]" for p in parts) if parts else "(no terms)")


def _rule_text(pod_spec: Mapping[str, Any], rule: str) -> str:
    if rule == "nodeSelector":
        return selector_text(pod_spec)
    if rule == "affinity":
        return affinity_text(pod_spec)
    return rule


# ------------------------------------------------------------------ a group's nodes
@dataclass(frozen=True)
class Fit:
    """The nodes a group's pods may use. ``restricted`` is False when every node is eligible
    (then the jobspec stays as it is)."""

    eligible: tuple[str, ...]
    total: int
    reason: str = ""  # why nodes are excluded (empty when none is)

    @property
    def restricted(self) -> bool:
        return len(self.eligible) < self.total

    @property
    def none(self) -> bool:
        return not self.eligible


def fit(pod_spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], *, conditions: bool = False) -> Fit:
    """Eligible node names for ``pod_spec`` and, when some are excluded, a reason naming the
    rules, e.g. "no node matches nodeSelector disktype=ssd" or "the pods may use 1 of 3 nodes
    (excluded: 2 by nodeSelector disktype=ssd)"."""
    ok: list[str] = []
    why: Counter[str] = Counter()
    total = 0
    for node in nodes:
        total += 1
        rule = why_not(pod_spec, node, conditions=conditions)
        if rule is None:
            ok.append(_name(node))
        else:
            why[rule] += 1
    ok.sort()
    if not why:
        return Fit(tuple(ok), total)
    if not ok and len(why) == 1:
        rule = next(iter(why))
        if rule == "nodeSelector" or rule == "affinity":
            text = f"no node matches {_rule_text(pod_spec, rule)}"
        else:
            text = f"every node has a {rule} the pods do not tolerate"
        return Fit((), total, text)
    detail = ", ".join(f"{n} by {_rule_text(pod_spec, r)}" for r, n in sorted(why.items(), key=lambda kv: -kv[1]))
    head = "no node allows the pods" if not ok else f"the pods may use {len(ok)} of {total} nodes"
    return Fit(tuple(ok), total, f"{head} (excluded: {detail})")


def rules_key(pod_spec: Mapping[str, Any]) -> str:
    """What eligibility depends on in a pod spec (groups with equal keys share one answer)."""
    return json.dumps([pod_spec.get("nodeSelector") or {}, required_affinity(pod_spec) or {},
                       pod_spec.get("tolerations") or []], sort_keys=True, default=str)


def has_rules(pod_spec: Mapping[str, Any]) -> bool:
    """Does the pod restrict nodes by labels or names (taints aside)?"""
    return bool(pod_spec.get("nodeSelector")) or required_affinity(pod_spec) is not None


class NodeView:
    """What eligibility depends on for each node (labels, durable hard taints), with a version
    that changes only when one of those does: status heartbeats do not make groups refit."""

    def __init__(self) -> None:
        self.version = 0
        self.synced = False
        self._nodes: dict[str, dict[str, Any]] = {}
        self._memo: dict[str, Fit] = {}
        self._tainted = False
        self._all = Fit((), 0)

    @staticmethod
    def _essence(node: Mapping[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": _name(node), "labels": _labels(node)},
                "spec": {"taints": [dict(t) for t in hard_taints(node, conditions=False)]}}

    def reset(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self._nodes = {}
        for n in nodes:
            self._nodes[_name(n)] = self._essence(n)
        self.synced = True
        self._changed()

    def update(self, name: str, node: Mapping[str, Any] | None) -> bool:
        """A Node was added, changed (``node``) or deleted (None); True if eligibility may
        have changed for some pod."""
        if not self.synced:
            return False
        if node is None:
            if self._nodes.pop(name, None) is None:
                return False
        else:
            essence = self._essence(node)
            if self._nodes.get(name) == essence:
                return False
            self._nodes[name] = essence
        self._changed()
        return True

    def _changed(self) -> None:
        self.version += 1
        self._memo.clear()
        self._tainted = any(n["spec"]["taints"] for n in self._nodes.values())
        self._all = Fit(tuple(sorted(self._nodes)), len(self._nodes))

    def fit(self, pod_spec: Mapping[str, Any]) -> Fit:
        if not self._tainted and not has_rules(pod_spec):
            return self._all  # the common case: every node, no work per group
        key = rules_key(pod_spec)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = fit(pod_spec, self._nodes.values())
        return hit


# ------------------------------------------------------------------ jobspecs
def encode_hostlist(names: Iterable[str]) -> list[str]:
    """Names -> RFC 29 hostlist entries ("kwok-node-[0-2,5]"); names without a plain numeric
    suffix are listed as they are. ``expand_hostlist`` gives the same set back."""
    groups: dict[str, list[int]] = {}
    plain: list[str] = []
    for n in sorted(set(names)):
        m = _NUMBERED.match(n)
        if m and not m.group(1).endswith(("[", "]", ",")):
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            plain.append(n)
    out = list(plain)
    for prefix, ids in sorted(groups.items()):
        out.append(f"{prefix}{ids[0]}" if len(ids) == 1 else f"{prefix}[{encode_idset(ids)}]")
    return out


def unconstrained(js: Jobspec) -> Jobspec:
    """``js`` without what ``constrain`` added (the same object if it added nothing)."""
    system = (js.attributes or {}).get("system") or {}
    mark = system.get(SYSTEM_KEY) if isinstance(system, Mapping) else None
    if not isinstance(mark, Mapping):
        return js
    d = copy.deepcopy(js.to_dict())
    sysd = d["attributes"]["system"]
    del sysd[SYSTEM_KEY]
    if mark.get("constraints") is not None:
        sysd["constraints"] = mark["constraints"]
    else:
        sysd.pop("constraints", None)
    return parse_jobspec(d)


def constrain(js: Jobspec, f: Fit) -> Jobspec:
    """``js`` restricted to the eligible nodes of ``f`` (ANDed with its own constraint), or
    ``js`` itself when ``f`` excludes no node."""
    base = unconstrained(js)
    if not f.restricted:
        return base
    d = copy.deepcopy(base.to_dict())
    sysd = d.setdefault("attributes", {}).setdefault("system", {})
    own = sysd.get("constraints")
    hosts: dict[str, Any] = {"hostlist": encode_hostlist(f.eligible)}
    sysd["constraints"] = {"and": [own, hosts]} if own else hosts
    mark: dict[str, Any] = {"reason": f.reason, "eligible": len(f.eligible), "nodes": f.total}
    if own is not None:
        mark["constraints"] = own  # given back by unconstrained
    sysd[SYSTEM_KEY] = mark
    return parse_jobspec(d)


def note(js: Any) -> str:
    """"; <why nodes were excluded>" for a jobspec ``constrain`` restricted, else ""."""
    system = (getattr(js, "attributes", None) or {}).get("system") or {}
    mark = system.get(SYSTEM_KEY) if isinstance(system, Mapping) else None
    if isinstance(mark, Mapping) and mark.get("reason"):
        return f"; {mark['reason']}"
    return ""
