"""Reading a group (one jobspec, all-or-nothing) from a pod, its labels and its owner.

Rules, in order:
1. explicit labels on the pod: ``fluxnetes.io/group`` (+ ``fluxnetes.io/group-size``), Fluence's
   ``fluence.flux-framework.org/pod-group`` (+ ``.../group-size``) or coscheduling's
   ``scheduling.x-k8s.io/pod-group`` (whose size must come from one of the size labels);
2. the controlling owner, if it is a workload kind fluxnetes knows (Job: ``parallelism`` pods,
   ReplicaSet/StatefulSet: ``replicas`` pods — a Deployment's pods belong to its ReplicaSet;
   pods added by a scale-up after the group was allocated form a group of their own, see
   the controller);
3. otherwise the pod alone is a group of one.

Everything here is pure: no API calls, so the webhook and the operator share it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.resources import PodResources, ResourceError, pod_request

_DNS_LABEL = re.compile(r"[^a-z0-9.-]+")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class GroupError(ValueError):
    """Bad grouping/duration/jobspec input; the message names the field and the rule."""


@dataclass(frozen=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class GroupSpec:
    """What the queue needs to know about one group."""

    namespace: str
    name: str  # FluxJob name (DNS subdomain)
    size: int  # number of pods scheduled together
    request: PodResources  # per pod
    duration: int = 0  # seconds; 0 = unknown
    priority: int = 0
    owner: OwnerRef | None = None
    jobspec: str | None = None  # user-given jobspec (annotation), overrides the derived one
    exclusive: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    locality: str | None = None  # "socket": each pod within one NUMA domain (fluxnetes.io/topology)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def object_name(text: str) -> str:
    """A DNS-1123 name derived from any label value; a short hash keeps distinct inputs apart."""
    clean = _DNS_LABEL.sub("-", text.lower()).strip("-.") or "group"
    if clean != text or len(clean) > 200:
        digest = hashlib.sha1(text.encode()).hexdigest()[:6]
        clean = f"{clean[:200]}-{digest}"
    return clean


def _size_label(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        size = int(raw)
    except ValueError:
        raise GroupError(f"label {key}={raw!r}: group size must be a positive integer") from None
    if size < 1:
        raise GroupError(f"label {key}={raw!r}: group size must be at least 1")
    return size


def explicit_group(labels: Mapping[str, str]) -> tuple[str, int | None] | None:
    """(group name, size or None) from the group labels, or None when the pod has none."""
    for name_key, size_keys in (
        (names.LABEL_GROUP, (names.LABEL_GROUP_SIZE, names.FLUENCE_GROUP_SIZE)),
        (names.FLUENCE_GROUP, (names.FLUENCE_GROUP_SIZE, names.LABEL_GROUP_SIZE)),
        (names.COSCHED_GROUP, (names.LABEL_GROUP_SIZE, names.FLUENCE_GROUP_SIZE)),
    ):
        if name_key not in labels:
            continue
        value = labels[name_key]
        if not value or not _LABEL_VALUE.match(value):
            raise GroupError(f"label {name_key}={value!r}: group name must be a non-empty label value")
        size = None
        for sk in size_keys:
            size = _size_label(labels, sk)
            if size is not None:
                break
        return value, size
    # a size without a name is a mistake worth saying out loud
    for sk in (names.LABEL_GROUP_SIZE, names.FLUENCE_GROUP_SIZE):
        if sk in labels:
            _size_label(labels, sk)
            raise GroupError(f"label {sk} is set but no group name label ({names.LABEL_GROUP})")
    return None


def parse_duration(text: str, where: str = f"annotation {names.ANN_DURATION}") -> int:
    """Seconds from "3600", "90s", "5m", "1h30m", "2d"."""
    raw = text.strip()
    if raw.isdigit():
        return int(raw)
    m = _DURATION.match(raw)
    if not raw or not m or not any(m.groups()):
        raise GroupError(f"{where}={text!r}: duration must be seconds or like 90s, 5m, 1h30m, 2d")
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def duration_of(meta: Mapping[str, Any], spec: Mapping[str, Any], outer_deadline: object = None) -> int:
    """Duration from the annotation, else activeDeadlineSeconds (pod, or the owning Job's)."""
    ann = (meta.get("annotations") or {}).get(names.ANN_DURATION)
    if ann is not None:
        return parse_duration(str(ann))
    for value, where in ((spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds"),
                         (outer_deadline, "job spec.activeDeadlineSeconds")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GroupError(f"{where}={value!r}: must be a positive integer")
        return value
    return 0


def jobspec_of(meta: Mapping[str, Any]) -> str | None:
    """The user's jobspec annotation, checked to parse (the matcher re-reads it)."""
    text = (meta.get("annotations") or {}).get(names.ANN_JOBSPEC)
    if text is None:
        return None
    from fluxnetes.jobspec import JobspecError, parse_jobspec

    try:
        parse_jobspec(text)
    except JobspecError as exc:
        raise GroupError(f"annotation {names.ANN_JOBSPEC}: {exc}") from None
    except Exception as exc:  # YAML errors and the like: still user input
        raise GroupError(f"annotation {names.ANN_JOBSPEC}: does not parse: {exc}") from None
    return str(text)


def exclusive_of(meta: Mapping[str, Any]) -> bool:
    raw = (meta.get("annotations") or {}).get(names.ANN_EXCLUSIVE)
    if raw is None:
        return False
    if str(raw).lower() in ("true", "1", "yes"):
        return True
    if str(raw).lower() in ("false", "0", "no"):
        return False
    raise GroupError(f"annotation {names.ANN_EXCLUSIVE}={raw!r}: must be true or false")


def locality_of(meta: Mapping[str, Any]) -> str | None:
    from fluxnetes.jobspec.model import JobspecError
    from fluxnetes.jobspec.pods import locality_from_annotations

    try:
        return locality_from_annotations(meta.get("annotations"))
    except JobspecError as exc:
        raise GroupError(str(exc)) from None


def request_of(spec: Mapping[str, Any]) -> PodResources:
    try:
        return pod_request(spec)
    except ResourceError as exc:
        raise GroupError(str(exc)) from None


def controller_of(meta: Mapping[str, Any]) -> OwnerRef | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return OwnerRef(ref.get("apiVersion", ""), ref.get("kind", ""), ref.get("name", ""), ref.get("uid", ""))
    return None


def check_pod_template(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Everything a pod (or pod template) says about its group must be readable."""
    explicit_group(meta.get("labels") or {})
    duration_of(meta, spec)
    jobspec_of(meta)
    exclusive_of(meta)
    locality_of(meta)
    request_of(spec)


PriorityOf = Callable[[Mapping[str, Any]], int]


def default_priority(spec: Mapping[str, Any]) -> int:
    """A pod's priority as resolved by the API server from its PriorityClass (0 if none)."""
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def group_of_pod(
    pod: Mapping[str, Any],
    *,
    owner_size: Callable[[OwnerRef], int | None] = lambda _o: None,
    owner_deadline: Callable[[OwnerRef], object] = lambda _o: None,
    priority: PriorityOf = default_priority,
) -> GroupSpec:
    """The group a pod belongs to. ``owner_size`` answers a workload owner's pod count
    (None = not a workload kind, or not known yet)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ns = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    owner = controller_of(meta)
    explicit = explicit_group(labels)
    size: int | None
    if explicit is not None:
        name, size = object_name(explicit[0]), explicit[1]
        if size is None:
            size = owner_size(owner) if owner else None
        if size is None:
            raise GroupError(
                f"pod {ns}/{meta.get('name')}: group {explicit[0]!r} has no size: set label "
                f"{names.LABEL_GROUP_SIZE}"
            )
        group_owner = owner
    else:
        size = owner_size(owner) if owner else None
        if owner is not None and size is not None:
            name, group_owner = object_name(f"{owner.kind.lower()}-{owner.name}"), owner
        else:
            name, size, group_owner = object_name(f"pod-{meta.get('name', '')}"), 1, None
    deadline = owner_deadline(owner) if owner else None
    return GroupSpec(
        namespace=ns,
        name=name,
        size=size,
        request=request_of(spec),
        duration=duration_of(meta, spec, deadline),
        priority=priority(spec),
        owner=group_owner,
        jobspec=jobspec_of(meta),
        exclusive=exclusive_of(meta),
        labels=dict(labels),
        locality=locality_of(meta),
    )
