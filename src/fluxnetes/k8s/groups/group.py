"""``Group``: one FluxJob's worth of pods (a workload's, a label group's or a single pod's)
and everything the operator knows of it: phase, jobspec, members, slots, what it holds, its
FluxJob and store row. The group book (groupbook.py) makes and keeps them; the table holding
them (grouptable.py) is told when an indexed field changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.groups import GroupSpec
from fluxnetes.k8s.objects import _gated, _meta, _terminal
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.workloads import WorkloadKind

# the Group fields its table indexes (grouptable.py)
_INDEXED = frozenset({"phase", "fj_dirty", "held", "released"})


@dataclass
class Group:
    spec: GroupSpec
    kind: WorkloadKind | None = None
    phase: Phase = Phase.PROVISIONAL
    reason: str = ""
    jobspec: Any = None
    submit: int | None = None
    expected_start: int | None = None
    start: int | None = None
    end: int | None = None
    jobid: Any = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> pod
    slots: list[str] = field(default_factory=list)  # node of each slot
    slot_pod: list[str | None] = field(default_factory=list)  # uid in each slot
    released: set[int] = field(default_factory=set)
    held: dict[str, shares.Share] = field(default_factory=dict)  # node -> what is still held
    failed_pods: int = 0
    deleted_pods: int = 0  # pods deleted before they finished (their shares given back)
    resumed: bool = False
    # its workload's user suspended it after it was let go (a Job resumed, by fluxnetes or its
    # user): it waits, never resumed by fluxnetes, until the user resumes it (groupbook.suspension)
    suspended_by_user: bool = False
    # fluxnetes is suspending its workload itself (Allocation.evict: preempted, a node lost):
    # a suspension seen until its next start is fluxnetes' own, not its user's
    suspending: bool = False
    fj_exists: bool = False
    fj_dirty: bool = True
    # when the FluxJob first needed a write since the last one (monotonic): writes wait
    # `status_interval` so that a burst of transitions becomes one write (see flush_fluxjobs)
    fj_since: float | None = None
    jobspec_yaml: str | None = None  # the jobspec as text, made once (FluxJob spec, store row)
    fj_status: dict[str, Any] = field(default_factory=dict)
    fj_uid: str = ""
    # it needed a FluxJob once (--fluxjobs waiting: it waited, or ended otherwise than
    # completed): every later change is written too, even if the first write failed
    fj_wanted: bool = False
    store_uid: str = ""
    store_id: int | None = None
    alloc: list[shares.Share] = field(default_factory=list)  # what it was given when it started
    # (job id, the allocation note its placements carry: scheduling/allocation_note.py), made once
    alloc_note: tuple[Any, str | None] | None = None
    note: str = ""  # said again with its next start (e.g. why it was matched again)
    recovered: bool = False  # its allocation was made before a restart (pods carry older job ids)
    # a multi-role workload's pod sets (jobspec.podsets.PodSet; empty: one set, as for a Job)
    # and, once started, the pod set of each slot (k8s/groups/podset_groups.py)
    sets: list[Any] = field(default_factory=list)
    slot_set: list[str] = field(default_factory=list)
    # the GroupTable holding it (k8s/groups/grouptable.py): told when an indexed field is set
    table: Any = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _INDEXED:
            table = self.__dict__.get("table")
            if table is not None:
                table.field_set(self, name, self.__dict__.get(name), value)
        object.__setattr__(self, name, value)

    def holdings_changed(self) -> None:
        """Its ``held`` or ``released`` changed in place (fair share charges it again)."""
        if self.table is not None:
            self.table.touched.add(self.key)

    @property
    def key(self) -> tuple[str, str]:
        return self.spec.key

    @property
    def qid(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"

    def ref(self) -> dict[str, str]:
        return {"apiVersion": f"{names.API_GROUP}/{names.API_VERSION}", "kind": names.FLUXJOB_KIND,
                "name": self.spec.name, "namespace": self.spec.namespace}

    def forget_allocation(self) -> None:
        """Its allocation is over (given back) and it waits to be allocated again: queued
        again after preemption, or suspended by its user."""
        self.jobid = None
        self.slots, self.slot_pod, self.released, self.held, self.alloc = [], [], set(), {}, []
        self.start = self.end = self.expected_start = None
        self.resumed = self.recovered = False
        self.failed_pods = self.deleted_pods = 0
        self.alloc_note = None

    def new_store_row(self, base: str) -> None:
        """The group goes on under a new store row, its earlier one final: uid ``base``
        (its row's uid) with the suffix ``~requeue-N`` counted up (``x`` -> ``x~requeue-1``
        -> ``x~requeue-2``), its row id to be given by the store."""
        stem, _, n = base.rpartition("~requeue-")
        self.store_uid = f"{stem}~requeue-{int(n) + 1}" if stem and n.isdigit() else f"{base}~requeue-1"
        self.store_id = None

    def free_slots(self) -> int:
        """Slots neither given back nor taken by a pod."""
        return sum(1 for i, u in enumerate(self.slot_pod) if u is None and i not in self.released)

    def waiting(self) -> list[str]:
        """Gated, unfinished members without a slot, by pod name."""
        return [uid for uid, pod in sorted(self.members.items(), key=lambda kv: _meta(kv[1]).get("name", ""))
                if uid not in self.slot_pod and _gated(pod) and not _terminal(pod)]
