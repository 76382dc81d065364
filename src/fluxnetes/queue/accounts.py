"""The account tree: accounts and sub-accounts with shares, users or namespaces as leaves.

Pure core (no clock, no I/O). The tree is built from a plain dict (a parsed YAML file, a
custom resource's spec) and validated: every error names the object and the field
(``accounts.team-a.shares: must be an integer > 0, got 0``), as ``AccountError``.

Configuration shape::

    default: team-a            # optional: the leaf charged for jobs naming no known leaf
    accounts:
      team-a:
        shares: 70             # > 0; default 1
        parent: root           # optional; "root" (the implicit top) by default
        limits: {max_running_cores: 64, max_queued_jobs: 100}
        users: [alice, bob]    # leaves with 1 share each, or {alice: 2, bob: {shares: 1,
                               #                                limits: {...}}}
      team-a-ml: {parent: team-a, shares: 30}
      team-b: {shares: 30}

Every name (accounts and users) is unique in the tree; a job names the leaf it charges
(a user, a namespace, or an account without users or sub-accounts). ``root`` is reserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ROOT = "root"

LIMIT_FIELDS = (
    "max_running_cores",
    "max_running_gpus",
    "max_running_nodes",
    "max_running_jobs",
    "max_queued_jobs",
)


class AccountError(ValueError):
    """Bad account configuration: ``path`` names the object and field, ``rule`` the rule."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


@dataclass(frozen=True)
class Limits:
    """Per-account caps (None = no cap). Counted over the account and all its descendants."""

    max_running_cores: int | None = None
    max_running_gpus: int | None = None
    max_running_nodes: int | None = None
    max_running_jobs: int | None = None
    max_queued_jobs: int | None = None

    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in LIMIT_FIELDS)

    @classmethod
    def parse(cls, raw: Any, path: str) -> Limits:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise AccountError(path, f"must be a mapping of {', '.join(LIMIT_FIELDS)}")
        values: dict[str, int | None] = {}
        for key, value in raw.items():
            if key not in LIMIT_FIELDS:
                raise AccountError(f"{path}.{key}", f"unknown limit (known: {', '.join(LIMIT_FIELDS)})")
            if value is None:
                values[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise AccountError(f"{path}.{key}", f"must be an integer >= 0, got {value!r}")
            if value < 0:
                raise AccountError(f"{path}.{key}", f"must be >= 0, got {value}")
            values[key] = value
        return cls(**values)


@dataclass(frozen=True)
class Node:
    """One node of the tree: an account or a user/namespace leaf."""

    name: str
    parent: str | None  # None only for the root
    shares: int
    limits: Limits = field(default_factory=Limits)
    user: bool = False  # listed as a user (always a leaf)


def _shares(raw: Any, path: str) -> int:
    if raw is None:
        return 1
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise AccountError(path, f"must be an integer > 0, got {raw!r}")
    if raw <= 0:
        raise AccountError(path, f"must be an integer > 0, got {raw}")
    return raw


def _name(raw: Any, path: str) -> str:
    if not isinstance(raw, str) or not raw or raw != raw.strip():
        raise AccountError(path, f"must be a non-empty name, got {raw!r}")
    return raw


class AccountTree:
    """An immutable, validated tree. Names are unique; ``root`` is the top."""

    def __init__(self, nodes: Iterable[Node], default: str | None = None) -> None:
        self.nodes: dict[str, Node] = {ROOT: Node(ROOT, None, 1)}
        for node in nodes:
            if node.name in self.nodes:
                raise AccountError(f"accounts.{node.name}", "duplicate name")
            self.nodes[node.name] = node
        self.children: dict[str, list[str]] = {name: [] for name in self.nodes}
        for node in self.nodes.values():
            if node.parent is None:
                continue
            if node.parent not in self.nodes:
                raise AccountError(f"accounts.{node.name}.parent", f"unknown account {node.parent!r}")
            if self.nodes[node.parent].user:
                raise AccountError(f"accounts.{node.name}.parent",
                                   f"{node.parent!r} is a user, not an account")
            self.children[node.parent].append(node.name)
        self._check_cycles()
        # depth-first order from the root: parents before children (cycles excluded above)
        self.order: list[str] = []
        stack = [ROOT]
        while stack:
            name = stack.pop()
            self.order.append(name)
            stack.extend(reversed(self.children[name]))
        self.path: dict[str, tuple[str, ...]] = {ROOT: (ROOT,)}
        for name in self.order[1:]:
            parent = self.nodes[name].parent
            assert parent is not None
            self.path[name] = (*self.path[parent], name)
        self.leaves: list[str] = [n for n in self.order[1:] if not self.children[n]]
        if default is not None and default not in self.nodes:
            raise AccountError("default", f"unknown account {default!r}")
        if default is not None and self.children[default]:
            raise AccountError("default", f"{default!r} has users or sub-accounts; name a leaf")
        self.default = default

    def _check_cycles(self) -> None:
        reached: set[str] = set()
        for start in self.nodes:
            seen: list[str] = []
            name: str | None = start
            while name is not None and name not in reached:
                if name in seen:
                    loop = " -> ".join([*seen[seen.index(name):], name])
                    raise AccountError(f"accounts.{name}.parent", f"cycle: {loop}")
                seen.append(name)
                name = self.nodes[name].parent
            reached.update(seen)

    # --- building ---------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any) -> AccountTree:
        """Validate a configuration (see the module docstring)."""
        if not isinstance(data, Mapping):
            raise AccountError("<top>", "must be a mapping with 'accounts'")
        unknown = sorted(set(data) - {"accounts", "default"})
        if unknown:
            raise AccountError(unknown[0], "unknown field (known: accounts, default)")
        accounts = data.get("accounts")
        if not isinstance(accounts, Mapping) or not accounts:
            raise AccountError("accounts", "must be a non-empty mapping of account name -> settings")
        nodes: list[Node] = []
        where: dict[str, str] = {}  # name -> where it was declared, for duplicate errors
        for raw_name, spec in accounts.items():
            name = _name(raw_name, "accounts")
            path = f"accounts.{name}"
            if name == ROOT:
                raise AccountError(path, f"{ROOT!r} is the implicit top of the tree; do not declare it")
            spec = {} if spec is None else spec
            if not isinstance(spec, Mapping):
                raise AccountError(path, "must be a mapping (shares, parent, limits, users)")
            extra = sorted(set(spec) - {"shares", "parent", "limits", "users"})
            if extra:
                raise AccountError(f"{path}.{extra[0]}", "unknown field (known: shares, parent, limits, users)")
            parent = _name(spec.get("parent", ROOT), f"{path}.parent")
            nodes.append(Node(name, parent, _shares(spec.get("shares"), f"{path}.shares"),
                              Limits.parse(spec.get("limits"), f"{path}.limits")))
            nodes.extend(_users(spec.get("users"), name, f"{path}.users"))
        for node in nodes:
            path = f"accounts.{node.parent}.users.{node.name}" if node.user else f"accounts.{node.name}"
            if node.name == ROOT:
                raise AccountError(path, f"{ROOT!r} is reserved for the top of the tree")
            if node.name in where:
                raise AccountError(path, f"duplicate name (also {where[node.name]}); "
                                   "names are unique across accounts and users")
            where[node.name] = path
        default = data.get("default")
        if default is not None:
            default = _name(default, "default")
        return cls(nodes, default=default)

    @classmethod
    def flat(cls, leaves: Iterable[str], shares: int = 1, default: str | None = None) -> AccountTree:
        """One leaf per name directly under the root, equal shares (``--fairshare users``)."""
        return cls([Node(_name(n, "leaves"), ROOT, _shares(shares, "shares")) for n in leaves],
                   default=default)

    # --- questions --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def is_leaf(self, name: str) -> bool:
        return name != ROOT and not self.children[name]

    def resolve(self, name: str) -> str:
        """The leaf a job naming ``name`` charges: ``name`` itself if it is a leaf, else the
        default leaf; AccountError if there is none."""
        if name in self.nodes and self.is_leaf(name):
            return name
        if self.default is not None:
            return self.default
        if name not in self.nodes:
            raise AccountError("account", f"unknown account {name!r} and no default")
        raise AccountError("account", f"{name!r} has users or sub-accounts; jobs name a leaf")

    def aggregate(self, leaf_values: Mapping[str, float]) -> dict[str, float]:
        """Per-node sums of per-leaf values (accounts sum their descendants)."""
        totals = {name: 0.0 for name in self.nodes}
        for name, value in leaf_values.items():
            if name not in self.nodes:
                raise AccountError("usage", f"unknown account {name!r}")
            for ancestor in self.path[name]:
                totals[ancestor] += value
        return totals


def _users(raw: Any, account: str, path: str) -> list[Node]:
    if raw is None:
        return []
    out: list[Node] = []
    if isinstance(raw, list):
        for i, user in enumerate(raw):
            out.append(Node(_name(user, f"{path}[{i}]"), account, 1, user=True))
        return out
    if not isinstance(raw, Mapping):
        raise AccountError(path, "must be a list of names or a mapping name -> shares")
    for user, spec in raw.items():
        upath = f"{path}.{_name(user, path)}"
        if isinstance(spec, Mapping):
            extra = sorted(set(spec) - {"shares", "limits"})
            if extra:
                raise AccountError(f"{upath}.{extra[0]}", "unknown field (known: shares, limits)")
            out.append(Node(user, account, _shares(spec.get("shares"), f"{upath}.shares"),
                            Limits.parse(spec.get("limits"), f"{upath}.limits"), user=True))
        else:
            out.append(Node(user, account, _shares(spec, upath), user=True))
    return out
