"""FluxAccount objects and Namespaces -> the core account tree (``fluxnetes.queue.accounts``).

Pure: plain dicts in (what the API server returns), plain values out; no client, no clock.

* A ``FluxAccount`` (cluster-scoped, ``crds/fluxaccounts.fluxnetes.io.yaml``) is one account:
  ``spec.shares`` (>= 1), ``spec.parent`` (another FluxAccount; the top of the tree when
  unset), ``spec.default`` (at most one account) and ``spec.limits`` (``maxRunningCores``,
  ``maxRunningGPUs``, ``maxRunningNodes``, ``maxRunningJobs``, ``maxQueuedJobs``; >= 0).
* A Namespace chooses the account its work charges with the label (or annotation)
  ``fluxnetes.io/account``; it must name a FluxAccount without sub-accounts (a leaf).
* Everything else charges the default account: the one with ``spec.default: true``, else the
  FluxAccount named ``default_account`` ("default"), else an implicit leaf of that name
  with 1 share directly under the top (so unlabelled namespaces are never refused).

A bad FluxAccount (shares <= 0, a limit below zero, an unknown parent, a cycle, two
defaults) makes the whole configuration invalid: ``AccountConfigError`` names the object and
the field (``FluxAccount team-a: spec.parent: cycle: team-a -> team-b -> team-a``), and the
operator keeps its last good configuration. A bad Namespace only costs that namespace: it
charges the default account and ``AccountsConfig.problems`` says why (an Event).

QoS: the core's QoS factor is a job's priority over the highest priority (``qos_max``); on
Kubernetes the priority is the pod's PriorityClass value, and ``qos_max`` is the highest
value among the cluster's own PriorityClasses (the built-in ``system-*`` classes, above
one billion, would squash every other class to ~0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.queue.accounts import ROOT, AccountError, AccountTree

CRD_FILE = "fluxaccounts.fluxnetes.io.yaml"
KIND = "FluxAccount"
PLURAL = "fluxaccounts"
ACCOUNT_KEY = f"{names.DOMAIN}/account"  # Namespace label or annotation
DEFAULT_ACCOUNT = "default"

# spec.limits field -> core Limits field
LIMIT_FIELDS: dict[str, str] = {
    "maxRunningCores": "max_running_cores",
    "maxRunningGPUs": "max_running_gpus",
    "maxRunningNodes": "max_running_nodes",
    "maxRunningJobs": "max_running_jobs",
    "maxQueuedJobs": "max_queued_jobs",
}
SPEC_FIELDS = ("shares", "parent", "default", "limits")
# Kubernetes' own classes (system-cluster-critical, system-node-critical) are above this
SYSTEM_PRIORITY = 1_000_000_000


class AccountConfigError(ValueError):
    """A FluxAccount the tree cannot be built with; ``obj`` and ``field`` name where."""

    def __init__(self, obj: str, field_path: str, rule: str) -> None:
        super().__init__(f"{obj}: {field_path}: {rule}" if field_path else f"{obj}: {rule}")
        self.obj, self.field, self.rule = obj, field_path, rule


@dataclass(frozen=True)
class Problem:
    """A namespace whose account choice is ignored (it charges the default account)."""

    obj: str  # e.g. "Namespace team-a-dev"
    field: str  # e.g. "metadata.labels[fluxnetes.io/account]"
    rule: str
    namespace: str = ""

    def __str__(self) -> str:
        return f"{self.obj}: {self.field}: {self.rule}"


@dataclass(frozen=True)
class AccountsConfig:
    """A validated configuration: the core tree and which namespace charges which leaf."""

    tree: AccountTree
    namespaces: dict[str, str]  # namespace -> leaf account (only namespaces that chose one)
    declared: tuple[str, ...]  # FluxAccount names, in tree order
    default: str  # the leaf charged by every other namespace
    implicit_default: bool  # the default leaf is not a FluxAccount
    problems: tuple[Problem, ...] = field(default=())

    @property
    def enabled(self) -> bool:
        """At least one FluxAccount exists (otherwise fair share is off)."""
        return bool(self.declared)

    def account_of_namespace(self, namespace: str) -> str:
        return self.namespaces.get(namespace, self.default)

    def namespaces_of(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for ns, leaf in sorted(self.namespaces.items()):
            out.setdefault(leaf, []).append(ns)
        return out


def crd_manifest() -> dict[str, Any]:
    """The FluxAccount CRD, from its one source inside the package (``crds/``; deploy/crds
    and the chart's crds/ are copies made by hack/sync-chart-crds.sh)."""
    from importlib.resources import files

    import yaml

    doc: dict[str, Any] = yaml.safe_load((files("fluxnetes.k8s") / "crds" / CRD_FILE).read_text())
    return doc


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _int(raw: Any, obj: str, path: str, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise AccountConfigError(obj, path, f"must be an integer >= {minimum}, got {raw!r}")
    if raw < minimum:
        raise AccountConfigError(obj, path, f"must be >= {minimum}, got {raw}")
    return raw


def _account_spec(account: Mapping[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """(name, core settings, default?) of one FluxAccount; AccountConfigError if bad."""
    name = _meta(account).get("name")
    if not isinstance(name, str) or not name:
        raise AccountConfigError(KIND, "metadata.name", f"must be a non-empty name, got {name!r}")
    obj = f"{KIND} {name}"
    if name == ROOT:
        raise AccountConfigError(obj, "metadata.name", f"{ROOT!r} is the implicit top of the account tree")
    spec = account.get("spec")
    spec = {} if spec is None else spec
    if not isinstance(spec, Mapping):
        raise AccountConfigError(obj, "spec", f"must be a mapping ({', '.join(SPEC_FIELDS)})")
    for key in spec:
        if key not in SPEC_FIELDS:
            raise AccountConfigError(obj, f"spec.{key}", f"unknown field (known: {', '.join(SPEC_FIELDS)})")
    out: dict[str, Any] = {"shares": _int(spec.get("shares", 1), obj, "spec.shares", 1)}
    parent = spec.get("parent")
    if parent is not None:
        if not isinstance(parent, str) or not parent:
            raise AccountConfigError(obj, "spec.parent", f"must be a FluxAccount name, got {parent!r}")
        if parent == name:
            raise AccountConfigError(obj, "spec.parent", "an account cannot be its own parent")
        out["parent"] = parent
    default = spec.get("default", False)
    if not isinstance(default, bool):
        raise AccountConfigError(obj, "spec.default", f"must be true or false, got {default!r}")
    limits = spec.get("limits")
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise AccountConfigError(obj, "spec.limits", f"must be a mapping of {', '.join(LIMIT_FIELDS)}")
        core: dict[str, int] = {}
        for key, value in limits.items():
            if key not in LIMIT_FIELDS:
                raise AccountConfigError(obj, f"spec.limits.{key}",
                                         f"unknown limit (known: {', '.join(LIMIT_FIELDS)})")
            if value is not None:
                core[LIMIT_FIELDS[key]] = _int(value, obj, f"spec.limits.{key}", 0)
        if core:
            out["limits"] = core
    return name, out, default


def _translate(exc: AccountError, declared: Iterable[str], default: str | None,
               fallback: str | None = None) -> AccountConfigError:
    """The core's ``accounts.NAME.field`` path -> ``FluxAccount NAME: spec.field``."""
    path = exc.path
    if path == "default" and default is not None:
        return AccountConfigError(f"{KIND} {default}", "spec.default", exc.rule)
    if path == "default" and fallback is not None:  # the account named like the default has sub-accounts
        return AccountConfigError(f"{KIND} {fallback}", "metadata.name",
                                  f"{exc.rule} (it is the default account by its name; "
                                  "mark a leaf account with spec.default: true)")
    if path.startswith("accounts."):
        rest = path.removeprefix("accounts.")
        # names may hold dots: take the longest declared name the path starts with
        for name in sorted(declared, key=len, reverse=True):
            if rest == name or rest.startswith(name + "."):
                sub = rest[len(name) + 1:]
                snake = {v: k for k, v in LIMIT_FIELDS.items()}
                if sub.startswith("limits."):
                    sub = "limits." + snake.get(sub.removeprefix("limits."), sub.removeprefix("limits."))
                return AccountConfigError(f"{KIND} {name}", f"spec.{sub}" if sub else "", exc.rule)
    return AccountConfigError("FluxAccounts", path, exc.rule)


def namespace_choice(namespace: Mapping[str, Any]) -> tuple[str | None, str, Problem | None]:
    """The account a Namespace names (label first, then annotation), the field it came from,
    and a Problem when the two disagree (the label wins)."""
    md = _meta(namespace)
    ns = str(md.get("name") or "")
    labels = md.get("labels") or {}
    annotations = md.get("annotations") or {}
    label = labels.get(ACCOUNT_KEY) if isinstance(labels, Mapping) else None
    annotation = annotations.get(ACCOUNT_KEY) if isinstance(annotations, Mapping) else None
    label = label or None
    annotation = annotation or None
    where = f"metadata.labels[{ACCOUNT_KEY}]" if label is not None else f"metadata.annotations[{ACCOUNT_KEY}]"
    if label is not None and annotation is not None and label != annotation:
        return label, where, Problem(f"Namespace {ns}", f"metadata.annotations[{ACCOUNT_KEY}]",
                              f"says {annotation!r} but the label says {label!r}; the label wins", ns)
    return (label if label is not None else annotation), where, None


def parse_accounts(
    fluxaccounts: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]] = (),
    *,
    default_account: str = DEFAULT_ACCOUNT,
) -> AccountsConfig:
    """Build the configuration (see the module docstring). Raises AccountConfigError for a
    bad FluxAccount; bad Namespaces are reported in ``problems``."""
    accounts: dict[str, dict[str, Any]] = {}
    defaults: list[str] = []
    for account in fluxaccounts:
        name, spec, is_default = _account_spec(account)
        if name in accounts:
            raise AccountConfigError(f"{KIND} {name}", "metadata.name", "declared twice")
        accounts[name] = spec
        if is_default:
            defaults.append(name)
    if len(defaults) > 1:
        raise AccountConfigError(f"{KIND} {defaults[1]}", "spec.default",
                                 f"only one account may be the default (also {defaults[0]})")
    declared = list(accounts)
    implicit = False
    if defaults:
        default = defaults[0]
    else:
        default = default_account
        if default not in accounts:
            accounts[default] = {"shares": 1}
            implicit = True
    try:
        tree = AccountTree.from_dict({"accounts": accounts, "default": default})
    except AccountError as exc:
        raise _translate(exc, declared, defaults[0] if defaults else None, default) from None
    chosen: dict[str, str] = {}
    problems: list[Problem] = []
    for namespace in namespaces:
        ns = str(_meta(namespace).get("name") or "")
        if not ns:
            continue
        choice, where, problem = namespace_choice(namespace)
        if problem is not None:
            problems.append(problem)
        if choice is None:
            continue
        if choice == default:
            chosen[ns] = default
        elif choice not in declared:
            problems.append(Problem(f"Namespace {ns}", where,
                                    f"unknown {KIND} {choice!r}; charging the default account {default!r}", ns))
        elif not tree.is_leaf(choice):
            problems.append(Problem(f"Namespace {ns}", where,
                                    f"{KIND} {choice!r} has sub-accounts (name one of "
                                    f"{', '.join(tree.children[choice])}); charging the default account "
                                    f"{default!r}", ns))
        else:
            chosen[ns] = choice
    order = [name for name in tree.order if name in declared]
    return AccountsConfig(tree, chosen, tuple(order), default, implicit, tuple(problems))


def priority_classes_of(objs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """PriorityClass name -> value ("" for the globalDefault one, as the operator keeps them)."""
    out: dict[str, int] = {}
    for pc in objs:
        name = str(_meta(pc).get("name") or "")
        value = pc.get("value")
        if not name or isinstance(value, bool) or not isinstance(value, int):
            continue
        out[name] = value
        if pc.get("globalDefault"):
            out[""] = value
    return out


def qos_max(priority_classes: Mapping[str, int]) -> int:
    """The priority that gets QoS factor 1.0: the highest PriorityClass value below the
    system classes (0 when there is none: the core then takes the highest queued priority)."""
    return max((v for v in priority_classes.values() if 0 < v < SYSTEM_PRIORITY), default=0)


def qos_priority(pod_spec: Mapping[str, Any], priority_classes: Mapping[str, int]) -> int:
    """A pod's priority as the core's QoS sees it: ``spec.priority`` when the API server set
    it, else its PriorityClass's value (the globalDefault class for none; 0 without one)."""
    value = pod_spec.get("priority")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    name = pod_spec.get("priorityClassName")
    return priority_classes.get(str(name) if name else "", 0)


def qos_factor(priority: int, top: int) -> float:
    """The core's QoS factor (``priority / qos_max`` clamped to [0, 1]; 0 when ``top`` <= 0)."""
    return 0.0 if top <= 0 else min(max(priority / top, 0.0), 1.0)
