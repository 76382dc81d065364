"""`fluxnetes agent`: the node agent (one per node; the chart runs it as a DaemonSet).

It discovers the node's hardware and publishes it as a NodeResourceTopology object (when it
has API access), and joins the agents' tree for `kubectl fluxnetes nodes exec|broadcast`.
See docs/agent.md.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise typer.BadParameter(f"{listen!r}: expected HOST:PORT (e.g. 0.0.0.0:9946)", param_hint="--listen")
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_selector(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--node-selector")
        out[key] = value
    return out


def agent_main(
    node: Annotated[str, typer.Option("--node", envvar="NODE_NAME",
                                      help="This agent's node name (default: $NODE_NAME).")],
    peers: Annotated[str | None, typer.Option(
        "--peers", help="Static membership NAME=HOST:PORT,... instead of the cluster's Nodes.")] = None,
    peers_file: Annotated[Path | None, typer.Option(
        "--peers-file", help="Static membership from a file (one NAME=HOST:PORT per line), re-read "
        "when it changes.")] = None,
    fanout: Annotated[int, typer.Option("--fanout", min=1, help="Children per agent in the tree.")] = 256,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on (port 0: any).")] = "0.0.0.0:9946",
    port: Annotated[int | None, typer.Option(
        "--port", help="The agents' port on other nodes (cluster membership; default: --listen's).")] = None,
    cert_dir: Annotated[Path, typer.Option(
        "--cert-dir", help="ca.crt plus tls.crt/tls.key, or ca.key to issue them (the operator's CA).")]
        = Path("/etc/fluxnetes/agent-ca"),
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", help="Issued certificates and broadcast staging files.")] = Path("/var/lib/fluxnetes-agent"),
    data_dir: Annotated[Path, typer.Option(
        "--data-dir", help="Where `nodes broadcast` writes files (DEST is below it).")] = Path("/var/lib/fluxnetes/data"),
    exec_enabled: Annotated[bool, typer.Option("--exec-enabled/--exec-disabled",
                                               help="Allow `nodes exec` (off by default).")] = False,
    exec_user: Annotated[str | None, typer.Option(
        "--exec-user", help="Unprivileged user that runs `nodes exec` commands (needs root to switch).")] = None,
    exec_timeout: Annotated[float, typer.Option("--exec-timeout", help="Longest a command may run (s).")] = 300.0,
    dead_after: Annotated[float, typer.Option(
        "--dead-after", help="Seconds of silence after which a parent counts as lost.")] = 10.0,
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="Kubeconfig (default: in-cluster); not used with --peers.")] = None,
    node_selector: Annotated[str, typer.Option(
        "--node-selector", help="Only Nodes with these labels (KEY=VALUE,...) are members.")] = "",
    discover: Annotated[bool, typer.Option(
        "--discover/--no-discover", help="Publish this node's hardware as a NodeResourceTopology.")] = True,
    sysfs: Annotated[Path, typer.Option("--sysfs", help="sysfs root for discovery.")] = Path("/sys"),
    log_level: Annotated[str, typer.Option("--log-level", envvar="FLUXNETES_LOG_LEVEL")] = "INFO",
) -> None:
    """Run one node agent: hardware topology, and the tree for `nodes exec` / `nodes broadcast`."""
    import asyncio
    import logging

    from fluxnetes.agent import tls
    from fluxnetes.agent.tree import MembershipError, Tree, parse_peers

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, lport = _split_listen(listen)
    selector = _parse_selector(node_selector)
    if peers and peers_file:
        raise typer.BadParameter("give --peers or --peers-file, not both", param_hint="--peers")
    try:
        static = parse_peers(peers) if peers else (parse_peers(peers_file.read_text()) if peers_file else None)
    except (MembershipError, OSError) as exc:
        typer.echo(f"fluxnetes agent: {exc}", err=True)
        raise typer.Exit(2) from None
    if static is not None and node not in {m.name for m in static}:
        typer.echo(f"fluxnetes agent: --node {node} is not among the peers (it will wait, attached to "
                   "nobody, until the peers file names it)", err=True)
    me = next((m for m in static or [] if m.name == node), None)
    hosts = tuple(dict.fromkeys([h for h in (me.host if me else None, os.environ.get("POD_IP"),
                                              os.environ.get("HOST_IP"), "127.0.0.1") if h]))
    try:
        certs = tls.agent_certs(cert_dir, state_dir, node, hosts)
    except tls.CertError as exc:
        typer.echo(f"fluxnetes agent: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run() -> None:
        from fluxnetes.agent import membership
        from fluxnetes.agent.authz import Authorizer, KubeAuthorizer, LocalAuthorizer
        from fluxnetes.agent.overlay import Agent, AgentConfig

        kube = None
        authorizer: Authorizer = LocalAuthorizer()
        if static is None or kubeconfig is not None:
            from fluxnetes.k8s.kube import Kube

            try:
                kube = await Kube.from_config(str(kubeconfig) if kubeconfig else None, concurrency=4)
            except Exception as exc:  # no in-cluster config, unreadable kubeconfig, ...
                typer.echo(f"fluxnetes agent: cannot load the Kubernetes configuration ({exc}); "
                           "outside a cluster give --peers or --peers-file", err=True)
                raise typer.Exit(2) from None
            authorizer = KubeAuthorizer(kube)
        cfg = AgentConfig(node=node, certs=certs, state_dir=state_dir, data_dir=data_dir, listen_host=host,
                          listen_port=lport, fanout=fanout, exec_enabled=exec_enabled, exec_user=exec_user,
                          exec_timeout=exec_timeout, dead_after=dead_after)
        agent = Agent(cfg, Tree.build(static or [], fanout), authorizer)
        await agent.start()
        tasks = []
        if peers_file is not None:
            tasks.append(asyncio.ensure_future(membership.follow_peers_file(peers_file, fanout, agent.set_tree)))
        elif static is None:
            tasks.append(asyncio.ensure_future(membership.follow_nodes(
                kube, port or lport, fanout, agent.set_tree, selector)))
        if discover and kube is not None:
            tasks.append(asyncio.ensure_future(_publish_topology(kube, node, sysfs)))
        try:
            await asyncio.Event().wait()
        finally:
            for t in tasks:
                t.cancel()
            await agent.stop()
            if kube is not None:
                await kube.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


async def _publish_topology(kube: object, node: str, sysfs: Path) -> None:
    """Discovery and NodeResourceTopology publishing (fluxnetes.agent.discovery / nrt), then
    again every 10 minutes (hardware rarely changes; a restarted agent publishes at once)."""
    import asyncio
    import logging

    from fluxnetes.agent import discovery, nrt

    log = logging.getLogger("fluxnetes.agent")
    while True:
        try:
            hw = discovery.discover(sysfs)
            await nrt.publish(kube, node, hw)  # type: ignore[arg-type]
        except Exception as exc:  # a failed publish must not take the tree down
            log.warning("hardware topology not published: %r", exc)
        await asyncio.sleep(600)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent_main)
