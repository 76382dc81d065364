"""The one interface every workload kind implements (Kueue-style integrations).

A kind answers, for objects of that kind: how to mutate it at admission, which pod template
its pods come from, how many pods form its group, how to let it start once its group is
allocated, and whether a finished pod is replaced (its node share is then kept for the
replacement instead of being released). Adding a kind = adding one module in this package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fluxnetes.k8s import names
from fluxnetes.k8s.admission.hold import AUTO, GATE, hold_label_ops, hold_ops

JsonPatch = list[dict[str, Any]]

# the one pod set of a single-template kind (Job, ReplicaSet, StatefulSet)
MAIN_POD_SET = "main"
# set by the webhook on a workload it suspended: the operator resumes only workloads carrying it
ANN_SUSPENDED_BY = f"{names.DOMAIN}/suspended-by"
SUSPENDED_BY_US = "fluxnetes"


@dataclass(frozen=True)
class PodSetSpec:
    """Pods of one role in a group: how many, and the template they are made from (its
    requests and node rules). A group is matched all-or-nothing over all its pod sets, one
    slot shape per set."""

    name: str  # "main"; "launcher"/"worker" (MPIJob); a replicatedJob's name (JobSet); "leader"/"worker" (LWS)
    count: int
    template: Mapping[str, Any]  # a pod template: {"metadata": ..., "spec": ...}
    # JSON pointer of the template inside the workload ("" when it is not there: TrainJob's
    # pods come from its runtime, through the JobSet Trainer creates)
    path: str = "/spec/template"
    # the controller creates these pods only once other pods of the group run (JobSet InOrder
    # startup or dependsOn, MPIJob WaitForWorkersReady, LWS LeaderReady): the group's slots
    # are all allocated at once, but these pods arrive later and take theirs when they come
    deferred: bool = False


@dataclass(frozen=True)
class PodRoute:
    """Where a pod belongs: the top workload (the object the user made), the group within it
    (``index``: one LeaderWorkerSet replica; None: the whole workload), the pod set and the
    pod's stable index within that set (None when it has none)."""

    kind: str  # the top workload's kind, e.g. "MPIJob"
    namespace: str
    name: str  # the top workload's name
    pod_set: str
    slot: int | None = None
    index: int | None = None

    @property
    def group_base(self) -> str:
        """The group's name before object_name(): "<kind>-<name>[-<index>]" (lower case)."""
        base = f"{self.kind.lower()}-{self.name}"
        return base if self.index is None else f"{base}-{self.index}"


# (kind, namespace, name) -> the object as the operator's cache holds it, or None if unknown
Lookup = Callable[[str, str, str], Mapping[str, Any] | None]


def suspend_ops(obj: Mapping[str, Any], path: str, value_path: str | None = None) -> JsonPatch:
    """JSON patch ops suspending a workload at ``path`` (e.g. "/spec/suspend") and marking it
    ``fluxnetes.io/suspended-by: fluxnetes`` — unless its user created it suspended (then it is
    theirs to resume and carries no mark). ``value_path``: the parent object to create when
    absent (e.g. "/spec/runPolicy")."""
    cur: Any = obj
    for part in path.strip("/").split("/"):
        cur = (cur or {}).get(part) if isinstance(cur, Mapping) else None
    if cur is True:
        return []
    ops: JsonPatch = []
    if value_path is not None:
        parent: Any = obj
        for part in value_path.strip("/").split("/"):
            parent = (parent or {}).get(part) if isinstance(parent, Mapping) else None
        if not isinstance(parent, Mapping):
            ops.append({"op": "add", "path": value_path, "value": {}})
    ops.append({"op": "add", "path": path, "value": True})
    meta = obj.get("metadata") or {}
    if not meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANN_SUSPENDED_BY: SUSPENDED_BY_US}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(ANN_SUSPENDED_BY)}",
                    "value": SUSPENDED_BY_US})
    return ops


def count_field(value: object, default: int) -> int:
    """A replica/parallelism count as the API server stores it (a non-negative int), else
    ``default`` (absent, or a value the CRD's validation would not let through)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def marked_suspended_by_us(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANN_SUSPENDED_BY) == SUSPENDED_BY_US


def condition_true(obj: Mapping[str, Any], *types: str) -> bool:
    """Is one of the status conditions ``types`` True?"""
    return any(c.get("type") in types and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def managed_label_ops(labels: Mapping[str, str], base: str) -> JsonPatch:
    """JSON patch ops adding fluxnetes' managed label, and Fluence's / coscheduling's group
    labels in fluxnetes' spelling, to the pod (``base`` "") or pod template at ``base``. The
    same for both: a template's pods then carry what the pod webhook would have added, and
    skip it (webhook_config)."""
    new_labels = {names.LABEL_MANAGED: "true"}
    for src, dst in ((names.FLUENCE_GROUP, names.LABEL_GROUP), (names.COSCHED_GROUP, names.LABEL_GROUP),
                     (names.FLUENCE_GROUP_SIZE, names.LABEL_GROUP_SIZE)):
        if src in labels and dst not in labels and dst not in new_labels:
            new_labels[dst] = labels[src]
    if not labels:
        return [{"op": "add", "path": f"{base}/metadata/labels", "value": new_labels}]
    return [{"op": "add", "path": f"{base}/metadata/labels/{_escape(k)}", "value": v} for k, v in new_labels.items()]


def gate_template_patch(obj: Mapping[str, Any], base: str, hold: str = "gate") -> JsonPatch:
    """JSON patch adding fluxnetes' hold (see k8s/admission/hold.py: the gate, or its scheduler name)
    and managed label to the pod template at ``base``."""
    tmpl: Any = obj
    for part in base.strip("/").split("/"):
        if isinstance(tmpl, list):  # a list index (JobSet's replicatedJobs/<i>/...)
            tmpl = tmpl[int(part)] if part.isdigit() and int(part) < len(tmpl) else {}
        else:
            tmpl = (tmpl or {}).get(part) or {}
    ops: JsonPatch = []
    meta = tmpl.get("metadata")
    if not meta:
        ops.append({"op": "add", "path": f"{base}/metadata", "value": {}})
        meta = {}
    if hold == AUTO and (obj.get("spec") or {}).get("volumeClaimTemplates"):
        hold = GATE  # a StatefulSet's pods get claims its template does not show: kube-scheduler binds them
    spec, labels = tmpl.get("spec") or {}, meta.get("labels") or {}
    held = hold_ops(spec, base, hold)
    ops.extend(managed_label_ops(labels, base))
    ops.extend(hold_label_ops(labels, spec, base, hold))
    if not tmpl.get("spec"):
        ops.append({"op": "add", "path": f"{base}/spec", "value": {}})
    ops.extend(held)
    return ops


class WorkloadKind:
    """Base class; subclasses set the class attributes and override what differs."""

    api_version: ClassVar[str]  # "batch/v1"
    kind: ClassVar[str]  # "Job"
    plural: ClassVar[str]  # "jobs"
    # does this kind own pods directly (so that pods point at it as their controller)?
    owns_pods: ClassVar[bool] = True
    template_path: ClassVar[str] = "/spec/template"
    # a multi-role kind served by a CRD (MPIJob, JobSet, TrainJob, LeaderWorkerSet): off until
    # discovery shows its resource (workloads.enabled_kinds); its pods are routed with
    # ``route`` (labels), not through their controlling owner
    addon: ClassVar[bool] = False
    # kinds of the objects its controller creates for it (a JobSet's Jobs, an LWS's
    # StatefulSets, a TrainJob's JobSet): never grouped on their own (workloads.made_for)
    children: ClassVar[tuple[str, ...]] = ()

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    @property
    def version(self) -> str:
        return self.api_version.split("/")[-1]

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return (obj.get("spec") or {}).get("template") or {}

    def mutate(self, obj: Mapping[str, Any], *, suspend: bool = True, hold: str = "gate") -> JsonPatch:
        """Admission (CREATE) of an object of this kind: hold its pod template (``suspend``:
        also hold the workload itself, for kinds that can be suspended)."""
        return gate_template_patch(obj, self.template_path, hold)

    def size(self, obj: Mapping[str, Any]) -> int:
        """Pods in the group (replicas by default)."""
        replicas = (obj.get("spec") or {}).get("replicas")
        return 1 if replicas is None else int(replicas)

    def pods_left(self, obj: Mapping[str, Any]) -> int:
        """Pods its controller runs at once from now on (``size`` unless some work is done)."""
        return self.size(obj)

    def deadline(self, obj: Mapping[str, Any]) -> object:
        return None

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge patch that lets the workload create its pods once allocated (None: nothing)."""
        return None

    def held_by_fluxnetes(self, obj: Mapping[str, Any]) -> bool:
        """The workload is held (e.g. suspended) because fluxnetes held it at admission: the
        operator lets it go (``resume_patch``) once its group is allocated."""
        return False

    def held_by_user(self, obj: Mapping[str, Any]) -> bool:
        """The workload is held by its user (e.g. created suspended): fluxnetes neither queues
        nor resumes it until the user lets it go."""
        return False

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        """The workload is suspended, by whoever (a kind that cannot be: never)."""
        return False

    def replaces_pods(self, obj: Mapping[str, Any]) -> bool:
        """A finished pod will be replaced by the controller: keep its share for the new one."""
        return True

    def replaces_succeeded(self, obj: Mapping[str, Any]) -> bool:
        """A pod that succeeded will be followed by another one (``replaces_pods`` being
        true): keep its share. False for the multi-role kinds whose pods each run once (an MPI
        worker, a JobSet pod of a Job with as many pods as completions): it is given back as
        the pod ends."""
        return True

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        """Stable index of a pod within its group (node for index i stays the same)."""
        return None

    def finished(self, obj: Mapping[str, Any]) -> bool:
        """The workload is over (e.g. a Job's Complete or Failed condition): its group is never
        queued again and holds nothing."""
        return False

    def failed(self, obj: Mapping[str, Any]) -> bool:
        """The workload is over and failed (a Job's Failed condition)."""
        return False

    # -- multi-role kinds (additive: the defaults are today's one-template behaviour) ----------
    def pod_sets(self, obj: Mapping[str, Any]) -> list[PodSetSpec]:
        """The pod sets of one group of this workload (of each group, for kinds with
        ``replica_groups``). Default: one set, ``size`` pods from ``template``."""
        return [PodSetSpec(MAIN_POD_SET, self.size(obj), self.template(obj), self.template_path)]

    def replica_groups(self, obj: Mapping[str, Any]) -> int | None:
        """How many groups the workload is (each made of ``pod_sets``): None for one group
        for the whole workload (every kind but LeaderWorkerSet: one per replica)."""
        return None

    def route(self, pod: Mapping[str, Any], lookup: Lookup | None = None) -> PodRoute | None:
        """The workload, group and pod set ``pod`` belongs to, if it is one of this kind's
        pods (read from the labels its controller puts on them; ``lookup`` finds owners in the
        operator's cache where labels are not enough). Default: None (such pods are found
        through their controlling owner, as today)."""
        return None


class SuspendableKind(WorkloadKind):
    """A kind with a suspend field of its own (``suspend_path``): fluxnetes holds it there at
    admission (marked as its own hold) and lets it go with a merge patch setting it False."""

    suspend_path: ClassVar[tuple[str, ...]] = ("spec", "suspend")

    def _suspended(self, obj: Mapping[str, Any]) -> bool:
        cur: Any = obj
        for part in self.suspend_path:
            cur = cur.get(part) if isinstance(cur, Mapping) else None
        return cur is True

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        patch: dict[str, Any] = {self.suspend_path[-1]: False}
        for part in reversed(self.suspend_path[:-1]):
            patch = {part: patch}
        return patch

    def held_by_fluxnetes(self, obj: Mapping[str, Any]) -> bool:
        return self._suspended(obj) and marked_suspended_by_us(obj)

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return self._suspended(obj)

    def held_by_user(self, obj: Mapping[str, Any]) -> bool:
        return self._suspended(obj) and not marked_suspended_by_us(obj)
