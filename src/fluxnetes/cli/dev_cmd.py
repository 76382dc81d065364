"""`fluxnetes dev`: build and run a local Kubernetes control plane with fake (kwok) nodes."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Annotated

import typer

from fluxnetes.cli.common import error_exit

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help="Cluster directory (state, kubeconfig, PKI, logs). "
        "Default: $FLUXNETES_DEV_DIR or ~/.cache/fluxnetes/dev.",
    ),
]


def build(
    addons: Annotated[
        bool,
        typer.Option("--addons", help="Also build the JobSet, MPI Operator, LeaderWorkerSet and Trainer "
                     "controllers, Kueue and coscheduling (hack/build-addons.sh) for `dev cluster up --addons`."),
    ] = False,
) -> None:
    """Build kube-apiserver, controller-manager, scheduler, kubectl, etcd and kwok from Go modules.

    Runs hack/build-k8s.sh (skips what is already built; the cache is $FLUXNETES_K8S_HOME,
    default ~/.cache/fluxnetes/k8s).
    """
    from fluxnetes.devcluster.paths import k8s_home, repo_build_script, toolchain

    if addons:
        _build_addons()
    tools = toolchain()
    missing = tools.missing()
    if not missing:
        typer.echo(f"all binaries present in {tools.bin_dir}")
        return
    script = repo_build_script()
    if script is None:
        raise error_exit(
            "hack/build-k8s.sh not found (fluxnetes is not running from a source checkout); "
            f"missing: {', '.join(missing)}. Run the script from a fluxnetes checkout, or set "
            "FLUXNETES_K8S_HOME to a directory with bin/ and stages/ built by it."
        )
    if shutil.which("go") is None:
        raise error_exit(
            "the Go toolchain (>= 1.26) is needed to build the binaries: `go` is not on PATH"
        )
    typer.echo(f"building into {k8s_home()} with {script} (about 7 min the first time)")
    rc = subprocess.call(["bash", str(script)])
    if rc != 0:
        raise error_exit(f"{script} failed (exit {rc}); see its output above", rc)


def _build_addons() -> None:
    from fluxnetes.devcluster.paths import repo_build_script

    k8s_script = repo_build_script()
    script = k8s_script.with_name("build-addons.sh") if k8s_script else None
    if script is None or not script.is_file():
        raise error_exit("hack/build-addons.sh not found (fluxnetes is not running from a source checkout)")
    if shutil.which("go") is None:
        raise error_exit("the Go toolchain (>= 1.26) is needed to build the addons: `go` is not on PATH")
    rc = subprocess.call(["bash", str(script)])
    if rc != 0:
        raise error_exit(f"{script} failed (exit {rc}); see its output above", rc)


def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of fake nodes.")] = 3,
    cpu: Annotated[str, typer.Option(help="CPU of each node (quantity).")] = "32",
    memory: Annotated[str, typer.Option(help="Memory of each node (quantity).")] = "256Gi",
    gpus: Annotated[int, typer.Option(help="nvidia.com/gpu of each node.")] = 0,
    pods: Annotated[int, typer.Option(help="Pod capacity of each node.")] = 110,
    zones: Annotated[int, typer.Option(help="Zones (topology.kubernetes.io/zone).")] = 1,
    racks: Annotated[int, typer.Option(help="Racks per zone (fluxnetes.io/rack).")] = 1,
    directory: DirOption = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds to wait for everything (default: 300, plus 0.1 per node above 1,000)."),
    ] = None,
    addons: Annotated[
        str,
        typer.Option(help="Controllers of multi-role workloads to run too, comma-separated: "
                     "jobset, mpi, lws, trainer (brings jobset), or all (these four); and the peers for "
                     "bench/peers.py: kueue (Kueue v0.17.0), coscheduling (scheduler-plugins v0.34.7, "
                     "scheduler `scheduler-plugins-scheduler`). Built by hack/build-addons.sh."),
    ] = "",
    pod_duration: Annotated[
        str | None,
        typer.Option("--pod-duration", help="How long a Job's pods run on the fake nodes before they "
                     "succeed (an MPIJob's or JobSet's too: their Jobs' pods), e.g. 30s, 5m, 1h30m; a pod "
                     "annotated pod-complete.stage.kwok.x-k8s.io/delay=DURATION runs that long instead. "
                     "Default: they succeed at once (0)."),
    ] = None,
    timed_pods: Annotated[
        bool,
        typer.Option("--timed-pods", help="Honour the annotation pod-complete.stage.kwok.x-k8s.io/delay "
                     "on Job pods (implied by --pod-duration); pods without it succeed at once."),
    ] = False,
    real_nodes: Annotated[
        int,
        typer.Option("--real-nodes", help="Real kubelet nodes (0-2) beside the fake ones: root, "
                     "hack/build-realnode.sh; docs/real-nodes.md."),
    ] = 0,
    with_services: Annotated[
        bool,
        typer.Option("--services", help="Services for the real nodes' pods (kube-proxy; the API "
                     "server then listens on the real nodes' interface, reachable from pods); "
                     "one cluster per machine; docs/real-nodes.md."),
    ] = False,
) -> None:
    """Start etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1 and
    create fake nodes; returns when they are Ready (the processes keep running). With
    --addons, also the JobSet, MPI Operator, LeaderWorkerSet and Trainer controllers (or
    Kueue), with their CRDs and webhooks. With --pod-duration, Jobs run for a while instead of ending
    the instant they start."""
    from rich.console import Console

    from fluxnetes.devcluster import Cluster, ClusterError, ClusterOptions, NodeShape, NodeSpecError
    from fluxnetes.devcluster.addons import AddonError, parse
    from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION

    console = Console(stderr=True)
    shape = NodeShape(
        count=nodes, cpu=cpu, memory=memory, gpus=gpus, pods=pods, zones=zones, racks=racks
    )
    try:
        shape.validate()
        wanted = parse(addons)
        seconds = _pod_seconds(pod_duration)
    except (NodeSpecError, AddonError, ValueError) as exc:
        raise error_exit(str(exc), 2) from None
    start = time.monotonic()
    try:
        cluster = Cluster.up(
            ClusterOptions(
                nodes=shape,
                dir=directory,
                timeout=timeout,
                addons=wanted,
                timed_pods=timed_pods or seconds > 0,
                pod_duration=seconds,
                real_nodes=real_nodes,
                services=with_services,
                log=lambda msg: console.print(f"[dim]{msg}[/]", highlight=False),
            )
        )
    except ClusterError as exc:
        raise error_exit(str(exc)) from None
    elapsed = time.monotonic() - start
    t = cluster.timings
    typer.echo(
        f"dev cluster up in {elapsed:.1f} s: {nodes} nodes Ready (control plane "
        f"{t.get('control_plane', 0):.1f} s, node creation {t.get('create_nodes', 0):.1f} s, "
        f"Ready after {t.get('nodes_ready', 0):.1f} s"
        + (f", addons {', '.join(wanted)} in {t.get('addons', 0):.1f} s" if wanted else "")
        + (f", {real_nodes} real node(s) Ready in {t.get('real_nodes', 0):.1f} s" if real_nodes else "")
        + ")"
    )
    if seconds > 0 or timed_pods:
        typer.echo(f"  Job pods   : run {f'{seconds:g} s' if seconds else 'at once'}, or as long as "
                   f"their annotation {TIMED_POD_ANNOTATION} says")
    typer.echo(f"  API server : {cluster.api_url}")
    typer.echo(f"  kubeconfig : {cluster.kubeconfig}")
    typer.echo(f"  logs       : {cluster.dir / 'logs'}")
    typer.echo(f"  use it     : export KUBECONFIG={cluster.kubeconfig}")
    typer.echo(f"  kubectl    : {cluster.tools.binary('kubectl')}")
    typer.echo(f"  stop it    : fluxnetes dev cluster down --dir {cluster.dir}")


def _pod_seconds(text: str | None) -> int:
    """--pod-duration in seconds (0 when not given); ValueError naming the option."""
    if text is None:
        return 0
    from fluxnetes.k8s.groups import GroupError, parse_duration

    try:
        return parse_duration(text, "--pod-duration")
    except GroupError as exc:
        raise ValueError(str(exc)) from None


def down(directory: DirOption = None) -> None:
    """Stop every process of the dev cluster (by pid) and delete its etcd data."""
    from fluxnetes.devcluster import Cluster, ClusterError
    from fluxnetes.devcluster.state import dir_lock

    try:
        cluster = Cluster.attach(directory)
    except ClusterError as exc:
        typer.echo(f"nothing to stop: {exc}")
        return
    try:
        with dir_lock(cluster.dir):
            killed = cluster.down()
    except ClusterError as exc:
        raise error_exit(str(exc)) from None
    note = f" (killed after timeout: {', '.join(killed)})" if killed else ""
    typer.echo(f"dev cluster in {cluster.dir} stopped{note}")


def import_image(
    archive: Annotated[Path, typer.Argument(help="An OCI or docker image archive (e.g. "
                                            "~/.cache/fluxnetes/k8s/realnode/images/mpi.tar).")],
    directory: DirOption = None,
) -> None:
    """Import an image archive into every real node's containerd (pods then use it with
    imagePullPolicy: Never; there is no registry). docs/real-nodes.md."""
    from fluxnetes.devcluster import Cluster, ClusterError, realnode

    if not archive.is_file():
        raise error_exit(f"ARCHIVE: {archive} is not a file")
    try:
        cluster = Cluster.attach(directory)
        names = [n["name"] for n in (cluster.state.real_nodes or {}).get("nodes", [])]
        if not names:
            raise error_exit(f"the dev cluster in {cluster.dir} has no real nodes (up --real-nodes N)")
        realnode.import_images(cluster, archive)
    except ClusterError as exc:
        raise error_exit(str(exc)) from None
    typer.echo(f"imported {archive} into {', '.join(names)}")


def status(directory: DirOption = None) -> None:
    """Show the dev cluster's processes, API health and node readiness (exit 1 if unhealthy)."""
    from rich.console import Console
    from rich.table import Table

    from fluxnetes.devcluster import Cluster, ClusterError

    try:
        cluster = Cluster.attach(directory)
    except ClusterError as exc:
        raise error_exit(str(exc), 3) from None
    st = cluster.status()
    console = Console()
    table = Table(title=f"dev cluster {st.dir}")
    for col in ("component", "pid", "state", "RSS", "log"):
        table.add_column(col)
    for p in st.processes:
        state = "[green]running[/]" if p.running else "[red]stopped[/]"
        rss = f"{p.rss_mib:.0f} MiB" if p.running and p.rss_mib is not None else "-"
        table.add_row(p.name, str(p.pid), state, rss, p.log)
    console.print(table)
    console.print(f"API server {st.api_url}: {'ready' if st.api_ready else 'NOT ready'}")
    console.print(f"nodes Ready: {st.nodes_ready}/{st.nodes_total}")
    console.print(f"kubeconfig: {st.kubeconfig}", highlight=False)
    if not st.healthy:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    dev = typer.Typer(
        help="Local development: a Kubernetes control plane with fake nodes on 127.0.0.1.",
        no_args_is_help=True,
    )
    cluster = typer.Typer(
        help="Start, stop and inspect the local dev cluster.", no_args_is_help=True
    )
    dev.command("build")(build)
    cluster.command("up")(up)
    cluster.command("down")(down)
    cluster.command("status")(status)
    cluster.command("import-image")(import_image)
    dev.add_typer(cluster, name="cluster")
    app.add_typer(dev, name="dev")
