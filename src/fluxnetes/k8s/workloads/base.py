"""The one interface every workload kind implements (Kueue-style integrations).

A kind answers, for objects of that kind: how to mutate it at admission, which pod template
its pods come from, how many pods form its group, how to let it start once its group is
allocated, and whether a finished pod is replaced (its node share is then kept for the
replacement instead of being released). Adding a kind = adding one module in this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from fluxnetes.k8s import names
from fluxnetes.k8s.hold import hold_ops

JsonPatch = list[dict[str, Any]]


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
    """JSON patch adding fluxnetes' hold (see k8s/hold.py: the gate, or its scheduler name)
    and managed label to the pod template at ``base``."""
    tmpl = obj
    for part in base.strip("/").split("/"):
        tmpl = (tmpl or {}).get(part) or {}
    ops: JsonPatch = []
    meta = tmpl.get("metadata")
    if not meta:
        ops.append({"op": "add", "path": f"{base}/metadata", "value": {}})
        meta = {}
    ops.extend(managed_label_ops(meta.get("labels") or {}, base))
    if not tmpl.get("spec"):
        ops.append({"op": "add", "path": f"{base}/spec", "value": {}})
    ops.extend(hold_ops(tmpl.get("spec") or {}, base, hold))
    return ops


class WorkloadKind:
    """Base class; subclasses set the class attributes and override what differs."""

    api_version: ClassVar[str]  # "batch/v1"
    kind: ClassVar[str]  # "Job"
    plural: ClassVar[str]  # "jobs"
    # does this kind own pods directly (so that pods point at it as their controller)?
    owns_pods: ClassVar[bool] = True
    template_path: ClassVar[str] = "/spec/template"

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

    def replaces_pods(self, obj: Mapping[str, Any]) -> bool:
        """A finished pod will be replaced by the controller: keep its share for the new one."""
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
