"""`fluxnetes run`: the operator (webhook, queue, placement, sync) against a cluster."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig file (default: in-cluster, then ~/.kube/config)")] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context")] = None,
        store: Annotated[str | None, typer.Option(help="store URL: every decision is also written there (sqlite:///file.db, postgresql+psycopg://...)")] = None,
        policy: Annotated[str, typer.Option(help="queue policy: fcfs, easy, conservative, hybrid:N")] = "easy",
        match_policy: Annotated[str, typer.Option(help="match policy: first, low, high, lonode, hinode, lonodex, hinodex, firstnodex")] = "lonode",
        namespace: Annotated[str, typer.Option(help="the operator's own namespace (Lease, certificate Secret)")] = "fluxnetes-system",
        namespace_label: Annotated[str, typer.Option(help="label selecting the namespaces fluxnetes manages")] = "fluxnetes.io/enabled=true",
        webhook_port: Annotated[int, typer.Option(help="webhook HTTPS port (0 = any free port)")] = 9443,
        webhook_host: Annotated[str, typer.Option(help="webhook listen address")] = "127.0.0.1",
        webhook_url: Annotated[str | None, typer.Option(help="URL the API server calls (default https://127.0.0.1:PORT)")] = None,
        service_name: Annotated[str | None, typer.Option(help="in cluster: Service in front of the webhook")] = None,
        failure_policy: Annotated[str, typer.Option(help="webhook failurePolicy: Ignore (default: an outage never blocks the cluster) or Fail")] = "Ignore",
        leader_elect: Annotated[bool, typer.Option(help="Lease-based leader election")] = True,
        rack_label: Annotated[str, typer.Option(help="node label naming the rack")] = "fluxnetes.io/rack",
        on_node_lost: Annotated[str, typer.Option(help="groups on a lost node: fail or requeue")] = "fail",
        job_mode: Annotated[str, typer.Option(help="Jobs: suspend (created suspended, resumed when allocated) or gate (only their pods are gated)")] = "suspend",
        log_level: Annotated[str, typer.Option(help="log level")] = "INFO",
    ) -> None:
        """Run the fluxnetes operator (out of cluster with --kubeconfig, or in cluster)."""
        import logging

        from fluxnetes.k8s.config import OperatorConfig
        from fluxnetes.k8s.operator import main
        from fluxnetes.match.matcher import POLICIES
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
        if on_node_lost not in ("fail", "requeue"):
            raise typer.BadParameter("must be fail or requeue", param_hint="--on-node-lost")
        if job_mode not in ("suspend", "gate"):
            raise typer.BadParameter("must be suspend or gate", param_hint="--job-mode")
        if "=" not in namespace_label:
            raise typer.BadParameter("must be key=value", param_hint="--namespace-label")
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        main(OperatorConfig(
            kubeconfig=kubeconfig, context=context, store=store, policy=policy, match_policy=match_policy,
            namespace=namespace, namespace_label=namespace_label, webhook_port=webhook_port,
            webhook_host=webhook_host, webhook_url=webhook_url, service_name=service_name,
            failure_policy=failure_policy, leader_elect=leader_elect, rack_label=rack_label,
            on_node_lost=on_node_lost, job_mode=job_mode,
        ))
