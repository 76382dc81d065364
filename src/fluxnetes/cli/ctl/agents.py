"""`kubectl fluxnetes nodes exec|broadcast|tree`: work on the nodes through the agents' tree.

    kubectl fluxnetes nodes exec [--nodes HOSTLIST] -- CMD ARGS...
    kubectl fluxnetes nodes broadcast FILE DEST [--nodes HOSTLIST]
    kubectl fluxnetes nodes tree

The request goes to the rank-0 agent (the first Ready node by name), which fans it down the
tree. How the plugin reaches rank 0:

- on a cluster (default): it finds rank 0's agent pod and runs ``kubectl port-forward`` to its
  agent port, then authenticates with the kubeconfig's bearer token (``--token`` to give one,
  e.g. from ``kubectl create token``); rank 0 checks it with a TokenReview and a
  SubjectAccessReview (verb ``exec`` / ``broadcast`` on ``nodes.fluxnetes.io``).
- ``--address HOST:PORT`` (tests, or on a node): straight to an agent, with a client
  certificate from ``--cert-dir`` (``tls.crt``/``tls.key``, or ``ca.key`` to issue one for
  ``$USER``).

``nodes`` alone still prints the per-node use table (``hook`` wraps the existing command).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from fluxnetes.cli.ctl.common import ContextOpt, KubeconfigOpt, Output, OutputOpt, fail

AGENT_LABELS = "app.kubernetes.io/component=agent"
DEFAULT_AGENT_PORT = 9946

AddressOpt = Annotated[str | None, typer.Option(
    "--address", help="An agent's HOST:PORT, instead of port-forwarding to rank 0's agent pod.")]
CertDirOpt = Annotated[Path | None, typer.Option(
    "--cert-dir", help="Client certificate: tls.crt + tls.key (+ ca.crt), or ca.key to issue one.")]
TokenOpt = Annotated[str | None, typer.Option(
    "--token", envvar="FLUXNETES_TOKEN", help="Bearer token (default: the kubeconfig's).")]
AgentNsOpt = Annotated[str, typer.Option(
    "--agent-namespace", help="Namespace of the agent DaemonSet.")]
NodesOpt = Annotated[str | None, typer.Option(
    "--nodes", "-N", help="HOSTLIST of nodes (e.g. node[01-04],gpu7); default: every node.")]


class OpsError(Exception):
    """Printed without a traceback, exit 1."""


def hook(show: Callable[..., None]) -> typer.Typer:
    """The `nodes` group: `nodes` alone runs ``show`` (with its own options); subcommands
    exec / broadcast / tree."""
    import typing

    hints = typing.get_type_hints(show, include_extras=True)
    sig = inspect.signature(show)

    def callback(ctx: typer.Context, **kwargs: Any) -> None:
        if ctx.invoked_subcommand is None:
            show(**kwargs)

    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
    callback.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    callback.__annotations__ = {"ctx": typer.Context, **{p.name: p.annotation for p in params[1:]}}
    callback.__doc__ = show.__doc__
    group = typer.Typer(name="nodes", help=show.__doc__, no_args_is_help=False)
    group.callback(invoke_without_command=True)(callback)
    group.command("exec", context_settings={"allow_interspersed_args": False})(exec_cmd)
    group.command("broadcast")(broadcast_cmd)
    group.command("tree")(tree_cmd)
    return group


# -- reaching rank 0 -----------------------------------------------------------------------------


def _client_certs(cert_dir: Path | None) -> Any:
    from fluxnetes.agent import tls

    if cert_dir is None:
        return None
    if (cert_dir / "tls.crt").is_file() and (cert_dir / "tls.key").is_file():
        return tls.CertPaths(cert_dir / "ca.crt", cert_dir / "tls.crt", cert_dir / "tls.key")
    if (cert_dir / "ca.key").is_file():
        import getpass
        import tempfile

        out = Path(tempfile.mkdtemp(prefix="fluxnetes-client-"))
        return tls.issue(cert_dir, out, getpass.getuser(), org=tls.CLIENT_ORG, days=1)
    raise OpsError(f"--cert-dir {cert_dir}: needs tls.crt + tls.key, or ca.key")


async def _rank0_pod(kubeconfig: Path | None, context: str | None, namespace: str) -> tuple[str, str, int, str | None]:
    """(node, pod, port, token) of rank 0's agent, from the API server."""
    from fluxnetes.agent.tree import Tree, members_from_nodes
    from fluxnetes.k8s.kube import NODES, PODS, ApiError, Kube

    try:
        kube = await Kube.from_config(str(kubeconfig) if kubeconfig else None, context, concurrency=2)
    except Exception as exc:
        raise OpsError(f"cannot load the Kubernetes configuration: {exc}") from None
    try:
        nodes, _ = await kube.list(NODES)
        pods, _ = await kube.list(PODS, namespace, label_selector=AGENT_LABELS,
                                  field_selector="status.phase=Running")
    except ApiError as exc:
        raise OpsError(str(exc)) from None
    except OSError as exc:
        raise OpsError(f"cannot reach the API server: {exc}") from None
    finally:
        await kube.close()
    agent_nodes = {(p.get("spec") or {}).get("nodeName"): p for p in pods}
    if not agent_nodes:
        raise OpsError(f"no running agent pod in namespace {namespace} (enable the chart's agent: "
                       "--set agent.enabled=true; --agent-namespace to look elsewhere)")
    members = [m for m in members_from_nodes(nodes, DEFAULT_AGENT_PORT) if m.name in agent_nodes]
    tree = Tree.build(members)
    if not len(tree):
        raise OpsError("no Ready node runs an agent")
    root = tree.members[0].name
    pod = agent_nodes[root]
    port = DEFAULT_AGENT_PORT
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == "tree":
                port = int(p["containerPort"])
    auth = getattr(kube, "_headers", {}).get("Authorization", "")
    token = auth[7:] if auth.startswith("Bearer ") else None
    return root, str(pod["metadata"]["name"]), port, token


class _PortForward:
    """`kubectl port-forward` to the rank-0 agent pod on a free local port."""

    def __init__(self, namespace: str, pod: str, port: int, kubeconfig: Path | None, context: str | None) -> None:
        self.args = ["kubectl", "port-forward", "-n", namespace, f"pod/{pod}", f":{port}"]
        if kubeconfig:
            self.args[1:1] = ["--kubeconfig", str(kubeconfig)]
        if context:
            self.args[1:1] = ["--context", context]
        self.proc: Any = None

    def __enter__(self) -> str:
        import re
        import shutil
        import subprocess

        if shutil.which("kubectl") is None:
            raise OpsError("kubectl is not on PATH (needed to port-forward to the agent; or use --address)")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            self.__exit__()
            raise OpsError(f"kubectl port-forward failed: {(line + err).strip() or 'no output'}")
        return f"127.0.0.1:{m.group(1)}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _call(address: str | None, cert_dir: Path | None, token: str | None, kubeconfig: Path | None,
          context: str | None, namespace: str, request: Callable[[Any], Any]) -> Any:
    import asyncio

    from fluxnetes.agent.client import Client, ClientError

    certs = _client_certs(cert_dir)
    ca = cert_dir / "ca.crt" if cert_dir and (cert_dir / "ca.crt").is_file() else None

    def run(addr: str, tok: str | None) -> Any:
        try:
            return asyncio.run(request(Client(addr, certs=certs, ca=ca, token=tok)))
        except ClientError as exc:
            raise OpsError(str(exc)) from None

    if address:
        return run(address, token)
    _, pod, port, kube_token = asyncio.run(_rank0_pod(kubeconfig, context, namespace))
    tok = token or kube_token
    if certs is None and not tok:
        raise OpsError("your kubeconfig identity has no bearer token (client-certificate users): pass "
                       "--token (e.g. `kubectl create token SERVICEACCOUNT`) or --cert-dir")
    with _PortForward(namespace, pod, port, kubeconfig, context) as local:
        return run(local, tok)


def _expand(nodes: str | None) -> list[str] | None:
    from fluxnetes.agent.tree import MembershipError, expand_hostlist

    if nodes is None:
        return None
    try:
        out = expand_hostlist(nodes)
    except MembershipError as exc:
        raise OpsError(f"--nodes: {exc}") from None
    if not out:
        raise OpsError("--nodes: empty hostlist")
    return out


def _compress(names: list[str]) -> str:
    """node01,node02,node03,gpu1 -> node[01-03],gpu1 (for summaries)."""
    import re
    from itertools import groupby

    parsed = []
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)", n)
        parsed.append((m.group(1), m.group(2)) if m else (n, ""))
    out = []
    for prefix, grp in groupby(sorted(parsed, key=lambda p: (p[0], len(p[1]), p[1])), key=lambda p: p[0]):
        nums = [g[1] for g in grp]
        if nums == [""]:
            out.append(prefix)
            continue
        ranges, start, prev = [], nums[0], nums[0]
        for x in [*nums[1:], None]:
            if x is not None and x != "" and prev != "" and int(x) == int(prev) + 1 and len(x) == len(prev):
                prev = x
                continue
            ranges.append(start if start == prev else f"{start}-{prev}")
            if x is not None:
                start = prev = x
        out.append(f"{prefix}{ranges[0]}" if len(ranges) == 1 and "-" not in ranges[0] else f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)


# -- commands ------------------------------------------------------------------------------------


def exec_cmd(
    command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")],
    nodes: NodesOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds each node may take.")] = 60.0,
    address: AddressOpt = None,
    cert_dir: CertDirOpt = None,
    token: TokenOpt = None,
    agent_namespace: AgentNsOpt = "fluxnetes-system",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Run CMD on every chosen node (as the agents' unprivileged user); output by rank."""
    try:
        targets = _expand(nodes)
        reply = _call(address, cert_dir, token, kubeconfig, context, agent_namespace,
                      lambda c: c.exec(list(command), targets, timeout))
    except OpsError as exc:
        raise fail(exc) from None
    from fluxnetes.agent.client import summarise_exec

    by_code, rc = summarise_exec(reply)
    if output != Output.table:
        data = {"results": reply["results"], "missing": reply["missing"], "summary": by_code}
        typer.echo(json.dumps(data, indent=2) if output == Output.json else _yaml(data))
        raise typer.Exit(rc)
    for r in reply["results"]:
        code = r["returncode"] if r["returncode"] is not None else "-"
        typer.echo(f"== rank {r['rank']} {r['node']} (exit {code}) ==")
        if r["stdout"]:
            typer.echo(r["stdout"], nl=not r["stdout"].endswith("\n"))
        if r["stderr"]:
            typer.echo(r["stderr"], nl=not r["stderr"].endswith("\n"), err=True)
        if r["error"]:
            typer.echo(f"error: {r['error']}", err=True)
    for n, why in sorted(reply["missing"].items()):
        typer.echo(f"== {n}: {why} ==", err=True)
    summary = "; ".join(f"exit {k}: {_compress(v)}" for k, v in sorted(by_code.items()))
    typer.echo(f"{sum(len(v) for v in by_code.values())} node(s): {summary}", err=True)
    raise typer.Exit(rc)


def broadcast_cmd(
    file: Annotated[Path, typer.Argument(help="Local file to send.", exists=True, dir_okay=False, readable=True)],
    dest: Annotated[str, typer.Argument(help="Path below each agent's data directory.")],
    nodes: NodesOpt = None,
    chunk_mib: Annotated[int, typer.Option("--chunk-mib", min=1, max=32, help="Chunk size in MiB.")] = 1,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds the whole broadcast may take; "
                                           "nodes that have not confirmed the file by then are listed.")] = 3600.0,
    address: AddressOpt = None,
    cert_dir: CertDirOpt = None,
    token: TokenOpt = None,
    agent_namespace: AgentNsOpt = "fluxnetes-system",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Send FILE to DEST on every chosen node down the tree (chunked, sha256-checked)."""
    try:
        from fluxnetes.agent.transfer import TransferError, safe_dest

        try:
            safe_dest(dest)
        except TransferError as exc:
            raise OpsError(str(exc)) from None
        targets = _expand(nodes)
        reply = _call(address, cert_dir, token, kubeconfig, context, agent_namespace,
                      lambda c: c.broadcast(file, dest, targets, chunk_size=chunk_mib * 1024 * 1024,
                                            timeout=timeout))
    except OpsError as exc:
        raise fail(exc) from None
    failed = [r for r in reply["results"] if r["error"]]
    rc = 1 if failed or reply["missing"] else 0
    if output != Output.table:
        typer.echo(json.dumps(reply, indent=2) if output == Output.json else _yaml(reply))
        raise typer.Exit(rc)
    ok = [r["node"] for r in reply["results"] if not r["error"]]
    typer.echo(f"{file} ({reply['size']} bytes, {reply['chunks']} chunk(s), sha256 {reply['sha256'][:16]}...) "
               f"-> {dest}: verified on {len(ok)} node(s){': ' + _compress(ok) if ok else ''}")
    for r in failed:
        typer.echo(f"  rank {r['rank']} {r['node']}: {r['error']}", err=True)
    for n, why in sorted(reply["missing"].items()):
        typer.echo(f"  {n}: {why}", err=True)
    raise typer.Exit(rc)


def tree_cmd(
    address: AddressOpt = None,
    cert_dir: CertDirOpt = None,
    token: TokenOpt = None,
    agent_namespace: AgentNsOpt = "fluxnetes-system",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """The agents' tree as rank 0 sees it: members, who is attached, and to whom."""
    try:
        st = _call(address, cert_dir, token, kubeconfig, context, agent_namespace, lambda c: c.status())
    except OpsError as exc:
        raise fail(exc) from None
    st.pop("t", None)
    if output != Output.table:
        typer.echo(json.dumps(st, indent=2) if output == Output.json else _yaml(st))
        return
    attached = set(st["attached"])
    typer.echo(f"rank 0: {st['root']}; fanout {st['fanout']}; {len(attached)} of {len(st['members'])} "
               "member(s) attached")
    for rank, name in enumerate(st["members"]):
        parent = st["parents"].get(name, "-" if name == st["root"] else "")
        state = "attached" if name in attached else "NOT ATTACHED"
        typer.echo(f"{rank:>5}  {name:<30} parent {parent or '?':<30} {state}")
    for name in st.get("strays") or []:
        typer.echo(f"    -  {name:<30} still attached, no member (leaving)")


def _yaml(data: Any) -> str:
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False))
