"""Operator settings (the flags of ``fluxnetes run``)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = "fluxnetes-system"  # the operator's own namespace (Lease, Secret)
    namespace_label: str = "fluxnetes.io/enabled=true"
    policy: str = "easy"  # queue policy (fcfs, easy, conservative, hybrid:N)
    match_policy: str = "lonode"
    rack_label: str = "fluxnetes.io/rack"
    store: str | None = None
    # webhook
    webhook: bool = True
    webhook_host: str = "127.0.0.1"  # listen address
    webhook_port: int = 9443
    # replicas on one host may share webhook_port (SO_REUSEPORT), only when each says so and
    # the one already there proves it is a replica of this operator (webhook.check_sharing)
    webhook_share_port: bool = False
    webhook_url: str | None = None  # what the API server calls; default https://127.0.0.1:PORT
    service_name: str | None = None  # in cluster: the Service in front of the webhook
    failure_policy: str = "Fail"  # see webhook_config (the outage story)
    admit_template_pods: bool = False  # see webhook_config.Scope
    # ClusterRole owning the webhook configurations (deleted with it: webhook_config.Owner);
    # None or "": no owner, they outlive the operator
    owner_cluster_role: str | None = None
    # leadership
    leader_elect: bool = True
    lease_name: str = "fluxnetes-leader"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # the Lease (leader.py): a crashed leader is replaced after lease_seconds (+ retry_period);
    # a leader that could not renew for renew_deadline seconds stops writing (fencing), which
    # is lease_seconds - renew_deadline before anyone else may take over
    lease_seconds: int = 10
    renew_deadline: float = 7.0
    retry_period: float = 2.0
    # behaviour
    on_node_lost: str = "fail"  # fail | requeue
    # suspend: Jobs are created suspended and resumed when allocated (no pod exists before);
    # gate: Jobs run at once but their pods are held (two API writes fewer per Job); auto:
    # suspend only Jobs with activeDeadlineSeconds (admission.suspends), gate the others
    job_mode: str = "auto"
    # affinity: pods gated, pinned by node affinity, bound by kube-scheduler; bind: pods carry
    # schedulerName fluxnetes and the operator binds them; auto: bind unless the pod needs a
    # check only kube-scheduler makes (k8s/admission/hold.py needs_kube_scheduler), then affinity
    placement: str = "auto"
    cycle_interval: float = 2.0
    # a burst of arrivals waits this long for the rest before its cycle (0: a cycle per event batch)
    coalesce_seconds: float = 0.05
    # Normal Events per second (API server load); decisions stay in the FluxJob conditions
    event_rate: float = 20.0
    # a FluxJob's status is written this long after its first change (later changes ride along):
    # one write per burst of transitions instead of one per transition
    status_interval: float = 1.0
    # which groups get a FluxJob: only "waiting" ones (the default): a group that starts
    # within status_interval of its arrival and runs to completion is shown by its workload
    # and its pods' Events and gets none (persistence/status.py needs_fluxjob: each FluxJob
    # costs the API server a create and a status write, about 10 ms of its CPU; with them
    # single-pod Jobs ran ~1.39x slower than kube-scheduler's, issue 31); or "all" of them
    fluxjobs: str = "waiting"
    # the process's event loop: auto (uvloop if installed), uvloop or asyncio (k8s/event_loop.py)
    event_loop: str = "auto"
    # /metrics, /healthz, /readyz on this port (None or 0: not served)
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    api_concurrency: int = 64
    # fair share (k8s/fairshare/fairshare_book.py, docs/fairshare.md): "auto" = the queue is ordered by
    # multifactor priority as soon as a FluxAccount exists (plain order until then); "off" =
    # FluxAccounts and Namespaces are not even watched
    fairshare: str = "auto"
    fairshare_algorithm: str = "fair_tree"  # fair_tree | classic
    fairshare_half_life: int = 7 * 24 * 3600  # seconds; 0 = no decay
    # running jobs charged this many seconds ahead (queue/priority.py running_horizon): the
    # running split stays near the shares; 0 = Slurm's formula exactly
    fairshare_running_horizon: int = 600
    # the multifactor weights (age, fairshare, job_size, qos); empty = Slurm's example values
    fairshare_weights: dict[str, float] = field(default_factory=dict)
    fairshare_save_seconds: float = 30.0  # how often the decayed usage is written to the store
    # preemption (k8s/scheduling/preemption.py, docs/preemption.md): off unless turned on
    preemption: bool = False
    preemption_min_priority: int = 1000  # only jobs of at least this PriorityClass value preempt
    preemption_protected: tuple[str, ...] = ("system-cluster-critical", "system-node-critical")
    preemption_on_preempt: str = "requeue"  # requeue | fail
    preemption_grace_seconds: float = 60.0  # victims not gone after this: plan again
