"""`fluxnetes run`: the operator (webhook, queue, placement, sync) against a cluster."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig file (default: in-cluster, then ~/.kube/config)")] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context")] = None,
        store: Annotated[str | None, typer.Option(help="store URL, the queue's memory: every group and decision is written there and the queue resumes from it after a restart (sqlite:///file.db, postgresql+psycopg://..., or 'default' = a SQLite file in the user data dir)")] = None,
        policy: Annotated[str, typer.Option(help="queue policy: fcfs, easy, conservative, hybrid:N")] = "easy",
        match_policy: Annotated[str, typer.Option(help="match policy: first, low, high, lonode, hinode, lonodex, hinodex, firstnodex, locality, variation")] = "lonode",
        namespace: Annotated[str, typer.Option(help="the operator's own namespace (Lease, certificate Secret)")] = "fluxnetes-system",
        namespace_label: Annotated[str, typer.Option(help="label selecting the namespaces fluxnetes manages")] = "fluxnetes.io/enabled=true",
        webhook_port: Annotated[int, typer.Option(help="webhook HTTPS port (0 = any free port)")] = 9443,
        webhook_host: Annotated[str, typer.Option(help="webhook listen address")] = "127.0.0.1",
        webhook_share_port: Annotated[bool, typer.Option(help="let replicas of this operator on one host share --webhook-port (SO_REUSEPORT; the kernel spreads connections over the live ones). Each replica must pass it, and a replica joins only a port whose holder serves a certificate of this installation's CA (same cluster); without it a taken port is an error")] = False,
        webhook_url: Annotated[str | None, typer.Option(help="URL the API server calls (default https://127.0.0.1:PORT)")] = None,
        service_name: Annotated[str | None, typer.Option(help="in cluster: Service in front of the webhook")] = None,
        failure_policy: Annotated[str, typer.Option(help="webhook failurePolicy in opted-in namespaces: Fail (default: while no replica serves the webhook, creating pods and workloads there is refused, so nothing bypasses the queue) or Ignore (they are then created unmanaged and counted as foreign pods); other namespaces are never affected")] = "Fail",
        leader_elect: Annotated[bool, typer.Option(help="Lease-based leader election")] = True,
        lease_duration: Annotated[int, typer.Option(help="seconds a leader's Lease lasts without renewal: a crashed leader is replaced after this (+ --retry-period)")] = 10,
        renew_deadline: Annotated[float, typer.Option(help="a leader that could not renew its Lease for this many seconds stops writing and steps down (must be below --lease-duration: the difference is the safety margin before another replica may take over)")] = 7.0,
        leader_identity: Annotated[str | None, typer.Option(help="this replica's name in the Lease (default HOSTNAME-PID: in the chart's container the operator is PID 1 of its pod, so a container restarted in place, e.g. after a crash, takes its own Lease back at once instead of waiting for it to run out). Must differ between replicas: two with one identity would both lead")] = None,
        retry_period: Annotated[float, typer.Option(help="seconds between Lease renewals (a follower looks at the Lease every min(this, 1) seconds)")] = 2.0,
        rack_label: Annotated[str, typer.Option(help="node label naming the rack")] = "fluxnetes.io/rack",
        on_node_lost: Annotated[str, typer.Option(help="groups on a lost node: fail or requeue")] = "fail",
        placement: Annotated[str, typer.Option(help="auto: per pod, bind unless the pod needs kube-scheduler's own checks (volume claims, host ports, inter-pod affinity, topology spread), then affinity; affinity: pods are gated, pinned to their node by a node affinity and bound by kube-scheduler; bind: pods get schedulerName fluxnetes and the operator binds them (fewer API writes per pod, no kube-scheduler checks)")] = "auto",
        job_mode: Annotated[str, typer.Option(help="Jobs: auto (suspended only when they have activeDeadlineSeconds, so the deadline counts from the allocation; otherwise only their pods are held), suspend (created suspended, resumed when allocated) or gate (only their pods are held)")] = "auto",
        admit_template_pods: Annotated[bool, typer.Option(help="also send pods born gated (from a template fluxnetes already gated) through the pod webhook: one admission call more per pod, for clusters where a controller may strip template labels")] = False,
        coalesce: Annotated[float, typer.Option(help="seconds a burst of arrivals waits for the rest before its scheduling cycle (0 = a cycle per batch of events)")] = 0.05,
        event_rate: Annotated[float, typer.Option(help="Normal Events per second at most (Warnings are never dropped; every decision is also in the FluxJob's conditions)")] = 20.0,
        fluxjobs: Annotated[str, typer.Option(help="which groups get a FluxJob: waiting (default): only a group still queued --status-interval after its arrival, one that ended otherwise than Completed, and kinds whose recovery needs one (multi-role workloads, exclusive groups, user jobspecs, scale groups); a group placed at once that completes is shown by its workload, its pods and their Events and by `kubectl fluxnetes queue/explain` (two API writes fewer per group); all: a FluxJob for every group")] = "waiting",
        status_interval: Annotated[float, typer.Option(help="seconds between a FluxJob's first change and its status write; later changes ride along (one write per burst of transitions; 0 = at once)")] = 1.0,
        owner_cluster_role: Annotated[str, typer.Option(help="ClusterRole of the installation (the chart's, `fluxnetes` for dist/fluxnetes.yaml) that owns the webhook configurations and leader Lease the operator creates, so that uninstalling removes them; read at start-up, needs `get` on it. '' or a missing/unreadable ClusterRole: no owner (logged), they stay until deleted by hand")] = "fluxnetes",
        event_loop: Annotated[str | None, typer.Option(help="the operator's event loop: auto (uvloop when installed, else asyncio's), uvloop (fail if it is missing) or asyncio (the opt-out) (default: $FLUXNETES_EVENT_LOOP, else auto)")] = None,
        log_level: Annotated[str, typer.Option(help="log level")] = "INFO",
        log_format: Annotated[str | None, typer.Option(help="json or text (default: $FLUXNETES_LOG_FORMAT, else json unless stderr is a terminal)")] = None,
        metrics_port: Annotated[int | None, typer.Option(help="serve /metrics, /healthz, /readyz on this port (default: $FLUXNETES_METRICS_PORT; 0 = off)")] = None,
        fairshare: Annotated[str, typer.Option(help="fair share (docs/fairshare.md): auto = the queue is ordered by multifactor priority with fair share as soon as a FluxAccount exists (plain order until then); off = FluxAccounts and Namespaces are not watched")] = "auto",
        fairshare_algorithm: Annotated[str, typer.Option(help="fair-share factor: fair_tree (Slurm's Fair Tree) or classic")] = "fair_tree",
        fairshare_half_life: Annotated[int, typer.Option(help="seconds in which recorded usage loses half its weight (0 = never decays)")] = 7 * 24 * 3600,
        fairshare_running_horizon: Annotated[int, typer.Option(help="seconds of usage running jobs are charged ahead, so the running split stays near the shares (0 = Slurm's formula exactly: the split swings with the jobs' durations)")] = 600,
        fairshare_weights: Annotated[str, typer.Option(help="multifactor weights, e.g. 'age=1000,fairshare=10000,job_size=1000,qos=1000' (unnamed ones keep these defaults)")] = "",
        fairshare_save_seconds: Annotated[float, typer.Option(help="seconds between writes of the accounts' usage to the store (also written on stop)")] = 30.0,
        preemption: Annotated[bool, typer.Option(help="let the head of the queue, of higher PriorityClass value, evict whole lower-QoS groups to start now (docs/preemption.md)")] = False,
        preemption_min_priority: Annotated[int, typer.Option(help="only jobs whose PriorityClass value is at least this may preempt")] = 1000,
        preemption_protected: Annotated[str, typer.Option(help="comma-separated PriorityClasses never preempted (classes above one billion never are)")] = "system-cluster-critical,system-node-critical",
        preemption_on_preempt: Annotated[str, typer.Option(help="victims: requeue (a Job is suspended again and runs later) or fail")] = "requeue",
        preemption_grace_seconds: Annotated[float, typer.Option(help="victims still running after this many seconds: the queue goes on and the head may plan again")] = 60.0,
    ) -> None:
        """Run the fluxnetes operator (out of cluster with --kubeconfig, or in cluster)."""
        import logging

        from fluxnetes.k8s.config import OperatorConfig
        from fluxnetes.k8s.operator import main
        from fluxnetes.match.policies import POLICIES
        from fluxnetes.queue.policy import PolicyError, QueuePolicy

        if match_policy not in POLICIES:
            raise typer.BadParameter(f"unknown match policy {match_policy!r} (known: {', '.join(POLICIES)})",
                                     param_hint="--match-policy")
        try:
            QueuePolicy.parse(policy)
        except PolicyError as exc:
            raise typer.BadParameter(str(exc), param_hint="--policy") from None
        if failure_policy not in ("Ignore", "Fail"):
            raise typer.BadParameter("must be Ignore or Fail", param_hint="--failure-policy")
        if not 2 <= lease_duration <= 600:
            raise typer.BadParameter("must be between 2 and 600 seconds", param_hint="--lease-duration")
        if not 0 < renew_deadline < lease_duration:
            raise typer.BadParameter(f"must be above 0 and below --lease-duration ({lease_duration})",
                                     param_hint="--renew-deadline")
        if not 0 < retry_period < renew_deadline:
            raise typer.BadParameter(f"must be above 0 and below --renew-deadline ({renew_deadline:g})",
                                     param_hint="--retry-period")
        if on_node_lost not in ("fail", "requeue"):
            raise typer.BadParameter("must be fail or requeue", param_hint="--on-node-lost")
        if job_mode not in ("auto", "suspend", "gate"):
            raise typer.BadParameter("must be auto, suspend or gate", param_hint="--job-mode")
        if placement not in ("auto", "affinity", "bind"):
            raise typer.BadParameter("must be auto, affinity or bind", param_hint="--placement")
        if store is not None and store.strip().lower() == "default":
            from fluxnetes.config import default_store_url

            store = default_store_url()
        if store:
            from fluxnetes.store import StoreConfigError, check_url

            try:
                check_url(store)
            except StoreConfigError as exc:
                raise typer.BadParameter(str(exc), param_hint="--store") from None
        if not 0 <= coalesce <= 5:
            raise typer.BadParameter("must be between 0 and 5 seconds", param_hint="--coalesce")
        if not 0 <= status_interval <= 60:
            raise typer.BadParameter("must be between 0 and 60 seconds", param_hint="--status-interval")
        if fluxjobs not in ("all", "waiting"):
            raise typer.BadParameter("must be all or waiting", param_hint="--fluxjobs")
        if event_rate < 0:
            raise typer.BadParameter("must be >= 0", param_hint="--event-rate")
        if "=" not in namespace_label:
            raise typer.BadParameter("must be key=value", param_hint="--namespace-label")
        import os

        from fluxnetes.logging import configure_from_env, configure_logging

        try:
            if log_format is not None:
                configure_logging(log_level, log_format.strip().lower())
            else:
                configure_from_env(log_level)
        except ValueError as exc:
            hint = "--log-level" if "level" in str(exc) else ("--log-format" if log_format is not None
                                                             else "FLUXNETES_LOG_FORMAT")
            raise typer.BadParameter(str(exc), param_hint=hint) from None
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        if metrics_port is None:
            raw = os.environ.get("FLUXNETES_METRICS_PORT", "").strip()
            if raw and (not raw.isdigit() or int(raw) > 65535):
                raise typer.BadParameter(f"must be a port number 0-65535, got {raw!r}",
                                         param_hint="FLUXNETES_METRICS_PORT")
            metrics_port = int(raw) if raw else None
        elif not 0 <= metrics_port <= 65535:
            raise typer.BadParameter("must be a port number 0-65535", param_hint="--metrics-port")
        if fairshare not in ("auto", "off"):
            raise typer.BadParameter("must be auto or off", param_hint="--fairshare")
        weights: dict[str, float] = {}
        for item in (w.strip() for w in fairshare_weights.split(",")):
            if not item:
                continue
            key, sep, raw = item.partition("=")
            try:
                weights[key.strip().replace("-", "_").replace("jobsize", "job_size")] = float(raw)
            except ValueError:
                raise typer.BadParameter(f"{item!r}: must be NAME=NUMBER", param_hint="--fairshare-weights") from None
            if not sep:
                raise typer.BadParameter(f"{item!r}: must be NAME=NUMBER", param_hint="--fairshare-weights")
            if not set(weights) <= {"age", "fairshare", "job_size", "qos"}:
                raise typer.BadParameter(f"{key.strip()!r}: unknown weight (known: age, fairshare, job_size, qos)",
                                         param_hint="--fairshare-weights")
        from fluxnetes.k8s.scheduling.cycle import fairshare_config
        from fluxnetes.queue.priority import PriorityError

        fs_flags = {"fairshare": fairshare, "fairshare_algorithm": fairshare_algorithm,
                    "fairshare_half_life": fairshare_half_life, "fairshare_weights": weights,
                    "fairshare_running_horizon": fairshare_running_horizon}
        try:
            fairshare_config(OperatorConfig(**fs_flags))  # type: ignore[arg-type]
        except PriorityError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fairshare-*") from None
        if fairshare_save_seconds <= 0:
            raise typer.BadParameter("must be > 0", param_hint="--fairshare-save-seconds")
        if preemption_on_preempt not in ("requeue", "fail"):
            raise typer.BadParameter("must be requeue or fail", param_hint="--preemption-on-preempt")
        if preemption_grace_seconds <= 0:
            raise typer.BadParameter("must be > 0", param_hint="--preemption-grace-seconds")
        if leader_identity is not None and not leader_identity.strip():
            raise typer.BadParameter("must not be empty", param_hint="--leader-identity")
        from fluxnetes.k8s.event_loop import EventLoopError, loop_factory, resolve_choice

        try:
            loop_choice = resolve_choice(event_loop)
            loop_factory(loop_choice)  # uvloop asked for but missing: said here, before any work
        except EventLoopError as exc:
            raise typer.BadParameter(str(exc), param_hint="--event-loop") from None
        named = {"identity": leader_identity.strip()} if leader_identity is not None else {}
        main(OperatorConfig(
            **named,  # type: ignore[arg-type]
            **fs_flags,  # type: ignore[arg-type]
            fairshare_save_seconds=fairshare_save_seconds, preemption=preemption,
            preemption_min_priority=preemption_min_priority,
            preemption_protected=tuple(p.strip() for p in preemption_protected.split(",") if p.strip()),
            preemption_on_preempt=preemption_on_preempt, preemption_grace_seconds=preemption_grace_seconds,
            kubeconfig=kubeconfig, context=context, store=store, policy=policy, match_policy=match_policy,
            namespace=namespace, namespace_label=namespace_label, webhook_port=webhook_port,
            webhook_share_port=webhook_share_port,
            webhook_host=webhook_host, webhook_url=webhook_url, service_name=service_name,
            failure_policy=failure_policy, leader_elect=leader_elect, rack_label=rack_label,
            lease_seconds=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period,
            on_node_lost=on_node_lost, job_mode=job_mode, metrics_port=metrics_port or None,
            admit_template_pods=admit_template_pods, coalesce_seconds=coalesce, event_rate=event_rate,
            status_interval=status_interval, fluxjobs=fluxjobs, placement=placement,
            owner_cluster_role=owner_cluster_role.strip() or None, event_loop=loop_choice,
        ))
