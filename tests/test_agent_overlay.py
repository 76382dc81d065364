"""The agents' overlay on 127.0.0.1: 50+ agents joined over mutual TLS (asyncio tasks in one
process for the scenarios, real `fluxnetes agent` processes for the smaller end-to-end test):
join, nodes added and deleted, a parent killed and its children re-parenting, exec results
by rank, broadcast with checksums (and resumed after a lost parent), and the refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from fluxnetes.agent import tls
from fluxnetes.agent.client import Client, ClientError, summarise_exec
from fluxnetes.agent.overlay import Agent, AgentConfig
from fluxnetes.agent.tree import Member, Tree
from fluxnetes.cli import ctl
from helpers import cli_app

EXEC_USER = "nobody" if os.geteuid() == 0 else None
MIB = 1024 * 1024


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Swarm:
    """N agents as asyncio tasks in this process, each with its own certificate and dirs."""

    def __init__(self, base: Path, n: int, fanout: int, **cfg: object) -> None:
        self.base, self.fanout, self.cfg = base, fanout, cfg
        tls.make_ca(base / "ca")
        self.members = [Member(f"node{i:03d}", "127.0.0.1", p) for i, p in enumerate(free_ports(n))]
        self.agents: dict[str, Agent] = {}
        self.client = Client(f"127.0.0.1:{self.members[0].port}",
                             certs=tls.issue(base / "ca", base / "client", "alice", org=tls.CLIENT_ORG))

    @property
    def tree(self) -> Tree:
        return Tree.build(self.members, self.fanout)

    async def start(self, m: Member) -> Agent:
        d = self.base / m.name
        cfg = AgentConfig(node=m.name, certs=tls.issue(self.base / "ca", d / "tls", m.name),
                          state_dir=d / "state", data_dir=d / "data", listen_host="127.0.0.1",
                          listen_port=m.port, fanout=self.fanout, exec_enabled=True, exec_user=EXEC_USER,
                          heartbeat=0.5, dead_after=10.0, retry=0.5, connect_timeout=2.0)
        cfg.__dict__.update(self.cfg)
        agent = Agent(cfg, self.tree)
        await agent.start()
        self.agents[m.name] = agent
        return agent

    async def start_all(self) -> None:
        for m in self.members:
            await self.start(m)

    def set_members(self, members: list[Member]) -> None:
        self.members = members
        for a in self.agents.values():
            a.set_tree(self.tree)

    @property
    def root(self) -> Agent:
        return self.agents[self.members[0].name]

    async def stop(self, name: str) -> None:
        await self.agents.pop(name).stop()

    async def stop_all(self) -> None:
        for name in list(self.agents):
            await self.stop(name)


async def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def swarm(tmp_path: Path) -> AsyncIterator[Swarm]:
    s = Swarm(tmp_path, 52, fanout=4)
    await s.start_all()
    await until(lambda: len(s.root.attached) == 52)
    yield s
    await s.stop_all()


def parents(s: Swarm) -> dict[str, str | None]:
    return {name: a.parent_name for name, a in s.agents.items()}


@pytest.mark.asyncio
async def test_52_agents_join_exec_by_rank_and_broadcast(swarm: Swarm, tmp_path: Path) -> None:
    tree = swarm.tree
    assert parents(swarm) == {m.name: (tree.parent(m.name).name if tree.parent(m.name) else None)  # type: ignore[union-attr]
                              for m in swarm.members}
    status = await swarm.client.status()
    assert status["attached"] == tree.names and status["root"] == "node000"

    reply = await swarm.client.exec(["sh", "-c", 'echo "$(id -un) $0"; exit $(( ${#0} % 2 ))', "x"], None, 30)
    ranks = [r["rank"] for r in reply["results"]]
    assert ranks == list(range(52)) and reply["missing"] == {}
    me = EXEC_USER or pwd.getpwuid(os.geteuid()).pw_name
    assert {r["stdout"] for r in reply["results"]} == {f"{me} x\n"}
    by_code, rc = summarise_exec(reply)
    assert by_code == {"1": tree.names} and rc == 1

    some = await swarm.client.exec(["true"], ["node007", "node031"], 30)
    assert [(r["node"], r["rank"], r["returncode"]) for r in some["results"]] == [("node007", 7, 0), ("node031", 31, 0)]

    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(8 * MIB + 12345))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = await swarm.client.broadcast(src, "/stage/payload.bin", None)
    assert out["missing"] == {} and out["sha256"] == digest and out["chunks"] == 9
    assert [r["rank"] for r in out["results"]] == list(range(52))
    assert all(r["error"] == "" for r in out["results"])
    for m in swarm.members:
        got = tmp_path / m.name / "data" / "stage" / "payload.bin"
        assert hashlib.sha256(got.read_bytes()).hexdigest() == digest
        assert not list((tmp_path / m.name / "state" / "transfers").glob("*.part"))  # staging cleaned


@pytest.mark.asyncio
async def test_killed_parent_children_reparent_and_come_back(swarm: Swarm) -> None:
    # fanout 4: node002's children are node009..node012, node009's are node037..node040
    victim = "node002"
    kids = [m.name for m in swarm.tree.children(victim)]
    assert kids == ["node009", "node010", "node011", "node012"]
    t0 = time.monotonic()
    await swarm.stop(victim)
    await until(lambda: all(swarm.agents[k].parent_name == "node000" for k in kids), timeout=30)
    print(f"re-parented in {time.monotonic() - t0:.2f} s")
    # the grandchildren stay where they are; the root still reaches every live agent
    assert swarm.agents["node037"].parent_name == "node009"
    await until(lambda: swarm.root.attached == set(swarm.tree.names) - {victim}, timeout=30)
    reply = await swarm.client.exec(["true"], None, 90)
    assert len(reply["results"]) == 51, reply["missing"]
    assert reply["missing"] == {victim: "agent not attached to the tree"}
    # the node comes back: its children return to it (no restart of anyone else)
    await swarm.start(next(m for m in swarm.members if m.name == victim))
    await until(lambda: all(swarm.agents[k].parent_name == victim for k in kids), timeout=30)
    await until(lambda: len(swarm.root.attached) == 52, timeout=30)


@pytest.mark.asyncio
async def test_nodes_added_and_deleted_follow_the_membership(swarm: Swarm) -> None:
    # a new node (sorted last) joins under its k-ary parent
    new = Member("node999", "127.0.0.1", free_ports(1)[0])
    swarm.set_members([*swarm.members, new])
    await swarm.start(new)
    expected = swarm.tree.parent("node999").name  # type: ignore[union-attr]
    await until(lambda: swarm.agents["node999"].parent_name == expected)
    await until(lambda: "node999" in swarm.root.attached)
    reply = await swarm.client.exec(["true"], ["node999"], 30)
    assert reply["results"][0]["rank"] == 52
    # node001 is deleted from the cluster: everyone re-ranks, its children re-parent per the new tree,
    # and it detaches (it is no member any more); nobody restarts
    before = {n: a.up.attach_count for n, a in swarm.agents.items()}
    swarm.set_members([m for m in swarm.members if m.name != "node001"])
    tree = swarm.tree
    await until(lambda: all(a.parent_name == (tree.parent(n).name if tree.parent(n) else None)  # type: ignore[union-attr]
                            for n, a in swarm.agents.items() if n != "node001"), timeout=40)
    await until(lambda: swarm.agents["node001"].parent_name is None)
    assert all(a is swarm.agents[n] for n, a in swarm.agents.items())
    assert swarm.agents["node000"].up.attach_count == before["node000"] == 0
    await until(lambda: swarm.root.attached == set(tree.names))
    with pytest.raises(ClientError, match=r"unknown node.*node001"):
        await swarm.client.exec(["true"], ["node001", "node003"], 30)


@pytest.mark.asyncio
async def test_unknown_nodes_are_listed(swarm: Swarm, tmp_path: Path) -> None:
    with pytest.raises(ClientError, match=r"unknown node\(s\): ghost1, ghost2"):
        await swarm.client.exec(["true"], ["node001", "ghost1", "ghost2"], 30)
    f = tmp_path / "f"
    f.write_bytes(b"x")
    with pytest.raises(ClientError, match=r"unknown node\(s\): nope"):
        await swarm.client.broadcast(f, "f", ["nope"])
    with pytest.raises(ClientError, match="DEST"):
        await swarm.client.broadcast(f, "../etc/passwd", None)


@pytest.mark.asyncio
async def test_broadcast_resumes_after_a_lost_parent(tmp_path: Path) -> None:
    # fanout 2 and a paced sender so the transfer is in flight when node001 goes away
    s = Swarm(tmp_path, 12, fanout=2, upload_rate=16 * MIB, dead_after=4.0)
    await s.start_all()
    try:
        await until(lambda: len(s.root.attached) == 12)
        src = tmp_path / "big.bin"
        src.write_bytes(os.urandom(12 * MIB))
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        task = asyncio.ensure_future(s.client.broadcast(src, "big.bin", None, chunk_size=256 * 1024))
        await until(lambda: any(len(r.have) > 4 for r in s.agents["node003"].downward.receivers.values()))
        assert not task.done()
        await s.stop("node001")  # parent of node003 / node004
        out = await task
        assert out["missing"] == {
            "node001": "agent detached from the tree during the request and did not come back"}
        assert len(out["results"]) == 11 and all(r["error"] == "" for r in out["results"])
        for name in s.agents:
            got = tmp_path / name / "data" / "big.bin"
            assert hashlib.sha256(got.read_bytes()).hexdigest() == digest
        assert s.agents["node003"].parent_name == "node000"
    finally:
        await s.stop_all()


@pytest.mark.asyncio
async def test_refusals(tmp_path: Path) -> None:
    s = Swarm(tmp_path, 3, fanout=2, exec_enabled=False)
    await s.start_all()
    try:
        await until(lambda: len(s.root.attached) == 3)
        with pytest.raises(ClientError, match="exec is disabled"):
            await s.client.exec(["true"], None, 5)
        # no certificate, a token, and no API server to check it
        anon = Client(s.client.address, ca=tmp_path / "ca" / "ca.crt", token="abc")
        with pytest.raises(ClientError, match="no Kubernetes API access"):
            await anon.status()
        # an agent certificate naming another node cannot join as that node
        (tmp_path / "ca2").mkdir()
        other = tls.make_ca(tmp_path / "ca2")
        stranger = tls.issue(other, tmp_path / "stranger", "node001")
        bad = Client(s.client.address, certs=stranger)
        with pytest.raises(ClientError, match=r"cannot connect|lost|certificate"):
            await bad.status()
        # a non-root agent redirects clients to rank 0
        via = Client(f"127.0.0.1:{s.members[2].port}", certs=s.client.certs)
        assert (await via.status())["root"] == "node000"
    finally:
        await s.stop_all()


# -- real processes ------------------------------------------------------------------------------


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    running: dict[str, subprocess.Popen[bytes]] = {}
    yield running
    for p in running.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in running.values():
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_agent_processes_join_survive_a_kill_and_broadcast(tmp_path: Path,
                                                            procs: dict[str, subprocess.Popen[bytes]]) -> None:
    n = 8
    ca = tls.make_ca(tmp_path / "ca")
    ports = free_ports(n)
    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"p{i}=127.0.0.1:{port}\n" for i, port in enumerate(ports)))
    for i, port in enumerate(ports):
        args = [sys.executable, "-m", "fluxnetes", "agent", "--node", f"p{i}", "--peers-file", str(peers),
                "--fanout", "2", "--listen", f"127.0.0.1:{port}", "--cert-dir", str(ca),
                "--state-dir", str(tmp_path / f"p{i}" / "state"), "--data-dir", str(tmp_path / f"p{i}" / "data"),
                "--exec-enabled", "--dead-after", "10", "--no-discover", "--log-level", "WARNING"]
        if EXEC_USER:
            args += ["--exec-user", EXEC_USER]
        # logs to a file: a pipe nobody reads would fill up and block the agent
        with (tmp_path / f"p{i}.log").open("wb") as log:
            procs[f"p{i}"] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    client = Client(f"127.0.0.1:{ports[0]}", certs=tls.issue(ca, tmp_path / "client", "bob", org=tls.CLIENT_ORG))

    def status() -> dict:
        try:
            return asyncio.run(client.status())
        except ClientError:
            return {}

    def wait(cond: Callable[[dict], bool], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = status()
            if st and cond(st):
                return st
            time.sleep(0.2)
        raise AssertionError(f"not reached; last status {status()}")

    # agents that started before their parent attach to an ancestor first, then move back
    expected = {f"p{i}": f"p{(i - 1) // 2}" for i in range(1, n)}
    wait(lambda st: len(st["attached"]) == n and st["parents"] == expected)
    reply = asyncio.run(client.exec(["hostname"], None, 20))
    assert [r["rank"] for r in reply["results"]] == list(range(n))
    assert all(r["returncode"] == 0 for r in reply["results"])

    # the kubectl plugin's commands, straight to an agent (p2 redirects to rank 0) with a client
    # certificate issued from the CA for the local user
    app = cli_app(ctl)
    run = CliRunner().invoke
    common = ["--address", f"127.0.0.1:{ports[2]}", "--cert-dir", str(ca)]
    res = run(app, ["ctl", "nodes", "exec", "--nodes", "p[0-2]", *common, "--", "sh", "-c", "echo hi; exit 2"])
    assert res.exit_code == 1, res.output
    assert "== rank 1 p1 (exit 2) ==\nhi\n" in res.output and "exit 2: p[0-2]" in res.output
    res = run(app, ["ctl", "nodes", "exec", "--nodes", "p0,ghost[1-2]", *common, "--", "true"])
    assert res.exit_code == 1 and "unknown node(s): ghost1, ghost2" in res.output
    res = run(app, ["ctl", "nodes", "tree", *common])
    assert res.exit_code == 0 and f"{n} of {n} member(s) attached" in res.output

    procs["p1"].kill()  # SIGKILL: no goodbye; children p3, p4 must re-parent to p0
    t0 = time.monotonic()
    st = wait(lambda st: st["parents"].get("p3") == "p0" and st["parents"].get("p4") == "p0", timeout=30)
    print(f"re-parented in {time.monotonic() - t0:.2f} s")
    assert st["parents"]["p7"] == "p3"

    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(3 * MIB + 7))
    res = run(app, ["ctl", "nodes", "broadcast", str(src), "/in/data.bin", *common, "-o", "json"])
    assert res.exit_code == 1, res.output  # p1 is a member but gone
    out = json.loads(res.stdout)
    assert out["missing"] == {"p1": "agent not attached to the tree"}
    assert [r["node"] for r in out["results"]] == ["p0", "p2", "p3", "p4", "p5", "p6", "p7"]
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    for i in (0, 2, 3, 4, 5, 6, 7):
        assert hashlib.sha256((tmp_path / f"p{i}" / "data" / "in" / "data.bin").read_bytes()).hexdigest() == digest

    # the peers file drops p6: it detaches, the others carry on
    peers.write_text("".join(f"p{i}=127.0.0.1:{port}\n" for i, port in enumerate(ports) if i != 6))
    wait(lambda st: "p6" not in st["members"] and "p6" not in st["attached"])


# -- on the local control plane: membership from Nodes, tokens and audit -------------------------

AGENT_TEST_LABEL = "fluxnetes.io/agent-test"


def _fake_node(name: str, port: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {AGENT_TEST_LABEL: "true", "type": "kwok"},
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0",
                                         "fluxnetes.io/agent-address": f"127.0.0.1:{port}"}},
            "spec": {}, "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                                   "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


@pytest.mark.k8s
@pytest.mark.asyncio
async def test_membership_follows_cluster_nodes_and_tokens_are_checked(k8s_cluster: Any, tmp_path: Path) -> None:
    from fluxnetes.agent import membership
    from fluxnetes.agent.authz import KubeAuthorizer
    from fluxnetes.k8s.kube import Kube

    cluster = k8s_cluster
    names = ["agt-a", "agt-b", "agt-c", "agt-d"]
    ports = dict(zip(names, free_ports(4), strict=True))
    kubectl = cluster.kubectl

    async def apply(obj: dict) -> None:
        await asyncio.to_thread(kubectl, "apply", "-f", "-", input=json.dumps(obj))

    for n in names[:3]:
        await apply(_fake_node(n, ports[n]))
    ca = tls.make_ca(tmp_path / "ca")
    kube = await Kube.from_config(str(cluster.kubeconfig), concurrency=8)
    agents: dict[str, Agent] = {}
    follow: list[asyncio.Future[None]] = []
    try:
        for n in names:
            cfg = AgentConfig(node=n, certs=tls.issue(ca, tmp_path / n / "tls", n), state_dir=tmp_path / n / "s",
                              data_dir=tmp_path / n / "d", listen_host="127.0.0.1", listen_port=ports[n],
                              exec_enabled=True, exec_user=EXEC_USER, dead_after=3, retry=0.5)
            agents[n] = Agent(cfg, Tree.build([]), KubeAuthorizer(kube, "default"))
            await agents[n].start()
            follow.append(asyncio.ensure_future(membership.follow_nodes(
                kube, 0, 256, agents[n].set_tree, {AGENT_TEST_LABEL: "true"})))
        root = agents["agt-a"]
        await until(lambda: root.attached == {"agt-a", "agt-b", "agt-c"}, timeout=60)
        assert agents["agt-d"].tree.rank("agt-d") is None  # not a Node yet: waits, attached to nobody
        await apply(_fake_node("agt-d", ports["agt-d"]))  # a node is added: its agent joins
        await until(lambda: root.attached == set(names), timeout=60)
        await asyncio.to_thread(kubectl, "delete", "node", "agt-b", "--wait=false")  # and one deleted
        await until(lambda: root.tree.names == ["agt-a", "agt-c", "agt-d"] and "agt-b" not in root.attached,
                    timeout=60)

        # bearer tokens: TokenReview + SubjectAccessReview (verb exec on nodes.fluxnetes.io), audited
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "agent-test-exec"},
                "rules": [{"apiGroups": ["fluxnetes.io"], "resources": ["nodes"], "verbs": ["exec"]}]}
        await apply(role)
        for sa in ("agent-ok", "agent-no"):
            await asyncio.to_thread(kubectl, "create", "serviceaccount", sa, "-n", "default", check=False)
        await asyncio.to_thread(kubectl, "create", "clusterrolebinding", "agent-test-exec", "--clusterrole",
                                "agent-test-exec", "--serviceaccount", "default:agent-ok", check=False)

        async def token(sa: str) -> str:
            res = await asyncio.to_thread(kubectl, "create", "token", sa, "-n", "default")
            return str(res.stdout.strip())

        addr = f"127.0.0.1:{ports['agt-a']}"
        ok = Client(addr, ca=ca / "ca.crt", token=await token("agent-ok"))
        reply = await ok.exec(["true"], None, 20)
        assert [r["node"] for r in reply["results"]] == ["agt-a", "agt-c", "agt-d"]
        assert ok.user == "system:serviceaccount:default:agent-ok"
        no = Client(addr, ca=ca / "ca.crt", token=await token("agent-no"))
        with pytest.raises(ClientError, match=r"may not exec nodes\.fluxnetes\.io"):
            await no.exec(["true"], None, 20)
        with pytest.raises(ClientError, match="token not accepted"):
            await Client(addr, ca=ca / "ca.crt", token="not-a-token").status()
        events = await asyncio.to_thread(cluster.kubectl_json, "get", "events", "-n", "default",
                                         "--field-selector", "reason=FluxnetesNodeExec")
        assert any("system:serviceaccount:default:agent-ok" in e["message"] for e in events["items"])
    finally:
        for f in follow:
            f.cancel()
        for a in agents.values():
            await a.stop()
        await kube.close()
        for n in names:
            await asyncio.to_thread(kubectl, "delete", "node", n, "--ignore-not-found", "--wait=false", check=False)
        await asyncio.to_thread(kubectl, "delete", "clusterrolebinding,clusterrole", "agent-test-exec",
                                "--ignore-not-found", check=False)
        await asyncio.to_thread(kubectl, "delete", "serviceaccount", "agent-ok", "agent-no", "-n", "default",
                                "--ignore-not-found", check=False)


def _fake_node_labelled(name: str, port: int, label: str) -> dict:
    node = _fake_node(name, port)
    node["metadata"]["labels"] = {label: "true", "type": "kwok"}
    return node


@pytest.mark.k8s
@pytest.mark.asyncio
async def test_a_node_deleted_during_a_broadcast_is_reported_and_the_tree_reforms(
        k8s_cluster: Any, tmp_path: Path) -> None:
    """Issue #29 item 5: four agents in a chain (fanout 1), membership from the API server's
    Nodes. A broadcast is in flight — its first chunks have reached the last agent, the
    client holds the rest back — when the third node is deleted while its agent keeps
    running. The broadcast ends, names that node as departed, delivers to the others; the
    tree re-forms without it and the next request works."""
    from fluxnetes.agent import membership
    from fluxnetes.agent.proto import send
    from fluxnetes.agent.rootrequests import DEPARTED
    from fluxnetes.agent.transfer import iter_chunks, make_manifest
    from fluxnetes.k8s.kube import Kube

    cluster = k8s_cluster
    label = "fluxnetes.io/agent-del-test"
    names = [f"agd-{i}" for i in range(4)]
    gone = names[2]
    ports = dict(zip(names, free_ports(4), strict=True))

    async def kubectl(*args: str, **kw: Any) -> Any:
        return await asyncio.to_thread(cluster.kubectl, *args, **kw)

    for n in names:
        await kubectl("apply", "-f", "-", input=json.dumps(_fake_node_labelled(n, ports[n], label)))
    ca = tls.make_ca(tmp_path / "ca")
    kube = await Kube.from_config(str(cluster.kubeconfig), concurrency=8)
    agents: dict[str, Agent] = {}
    follow: list[asyncio.Future[None]] = []
    try:
        for n in names:
            cfg = AgentConfig(node=n, certs=tls.issue(ca, tmp_path / n / "tls", n), state_dir=tmp_path / n / "s",
                              data_dir=tmp_path / n / "d", listen_host="127.0.0.1", listen_port=ports[n],
                              fanout=1, exec_enabled=True, exec_user=EXEC_USER, retry=0.5)
            agents[n] = Agent(cfg, Tree.build([], 1))
            await agents[n].start()
            follow.append(asyncio.ensure_future(membership.follow_nodes(
                kube, 0, 1, agents[n].set_tree, {label: "true"})))
        root = agents[names[0]]
        await until(lambda: root.attached == set(names), timeout=60)
        assert agents[names[3]].parent_name == gone  # the chain: agd-3 hangs below agd-2

        client = Client(f"127.0.0.1:{ports[names[0]]}",
                        certs=tls.issue(ca, tmp_path / "client", "carol", org=tls.CLIENT_ORG))
        src = tmp_path / "payload.bin"
        src.write_bytes(os.urandom(8 * 64 * 1024 + 99))
        m = make_manifest(src, "in/payload.bin", "pending", chunk_size=64 * 1024)
        held = asyncio.Event()

        async def body(writer: asyncio.StreamWriter) -> None:  # half now, the rest when told
            for i, data in enumerate(iter_chunks(src, 64 * 1024)):
                if i == 4:
                    await held.wait()
                await send(writer, {"t": "chunk", "i": i}, data)

        task = asyncio.ensure_future(client._call(
            {"t": "broadcast", "manifest": m.to_json(), "nodes": None, "timeout": 120}, body, wait=150))
        last = agents[names[3]]
        await until(lambda: any(len(r.have) == 4 for r in last.downward.receivers.values()), timeout=30)
        assert not task.done()

        await kubectl("delete", "node", gone, "--wait=false")  # its agent keeps running
        await until(lambda: all(a.tree.names == [n for n in names if n != gone] for a in agents.values()),
                    timeout=60)
        held.set()
        out = await asyncio.wait_for(task, 150)
        assert out["missing"] == {gone: DEPARTED}
        assert [(r["node"], r["error"]) for r in out["results"]] == [(n, "") for n in names if n != gone]
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        for n in names:
            if n != gone:
                got = tmp_path / n / "d" / "in" / "payload.bin"
                assert hashlib.sha256(got.read_bytes()).hexdigest() == digest

        # the tree re-forms: agd-3 below agd-1, agd-2 attached to nobody, nothing stale at rank 0
        await until(lambda: root.status()["attached"] == [n for n in names if n != gone]
                    and root.status()["strays"] == [], timeout=60)
        assert agents[names[3]].parent_name == names[1] and agents[gone].parent_name is None
        reply = await asyncio.wait_for(client.exec(["true"], None, 20), 90)
        assert [r["node"] for r in reply["results"]] == [n for n in names if n != gone]
        assert reply["missing"] == {}
    finally:
        for f in follow:
            f.cancel()
        for a in agents.values():
            await a.stop()
        await kube.close()
        for n in names:
            await kubectl("delete", "node", n, "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.asyncio
async def test_a_member_answered_by_another_agent_is_said_once(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A fake node without the address annotation: its address (InternalIP and the agents'
    port) is another agent's. Its would-be child routes around it and retries every
    `retry` seconds; the warning says once what is missing, not at every retry."""
    import logging

    s = Swarm(tmp_path, 3, fanout=1, retry=0.2)
    n0, n1, n2 = s.members
    wrong = Member("node001x", "127.0.0.1", n1.port, "node")  # sorts between node001 and node002
    s.members = [n0, n1, wrong, n2]
    caplog.set_level(logging.DEBUG, logger="fluxnetes.agent.parentlink")
    for m in (n0, n1, n2):
        await s.start(m)
    try:
        await until(lambda: s.agents["node002"].parent_name == "node001", timeout=30)
        retries = lambda: sum("node001x" in r.getMessage() for r in caplog.records)  # noqa: E731
        await until(lambda: retries() >= 3, timeout=30)
        said = [r for r in caplog.records if r.levelno >= logging.WARNING and "node001x" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert "no fluxnetes.io/agent-address annotation" in said[0].getMessage()
    finally:
        await s.stop_all()


@pytest.mark.asyncio
async def test_exec_never_runs_as_root_and_times_out() -> None:
    from fluxnetes.agent import execute

    with pytest.raises(execute.ExecRefused, match="is root"):
        execute.resolve_user("root")
    with pytest.raises(execute.ExecRefused, match="does not exist"):
        execute.resolve_user("no-such-user-here")
    if os.geteuid() == 0:
        with pytest.raises(execute.ExecRefused, match="no exec user is configured"):
            execute.resolve_user(None)
        who = execute.resolve_user("nobody")
        assert who is not None and who.uid == pwd.getpwnam("nobody").pw_uid
    else:
        with pytest.raises(execute.ExecRefused, match="cannot switch"):
            execute.resolve_user("nobody")
    slow = await execute.run("n", 3, ["sleep", "30"], EXEC_USER, 0.5)
    assert slow.returncode is None and "timed out" in slow.error and slow.rank == 3
    missing = await execute.run("n", 0, ["/no/such/binary"], EXEC_USER, 5)
    assert missing.returncode is None and "cannot start" in missing.error
    both = await execute.run("n", 0, ["sh", "-c", "echo out; echo err >&2; exit 4"], EXEC_USER, 5)
    assert (both.returncode, both.stdout, both.stderr) == (4, "out\n", "err\n")


def test_receiver_checks_every_chunk_and_the_whole_file(tmp_path: Path) -> None:
    from fluxnetes.agent.transfer import (
        Manifest,
        Receiver,
        TransferError,
        iter_chunks,
        make_manifest,
    )

    src = tmp_path / "f"
    src.write_bytes(os.urandom(5 * 1000 + 3))
    m = make_manifest(src, "/a/b", "t1", chunk_size=1000)
    assert m.n_chunks == 6 and Manifest.from_json(m.to_json()) == m
    r = Receiver.open(m, tmp_path / "st", tmp_path / "data")
    chunks = list(iter_chunks(src, 1000))
    with pytest.raises(TransferError, match="chunk 0 failed its sha256"):
        r.add(0, b"x" * 1000)
    for i in (3, 1, 0, 5, 2):  # out of order, as after a re-parent
        assert r.add(i, chunks[i])
    assert not r.add(1, chunks[1]) and r.missing() == [4]
    assert r.add(4, chunks[4]) and r.complete
    assert r.finish() == ""
    assert (tmp_path / "data" / "a" / "b").read_bytes() == src.read_bytes()
    r.close()
    assert (tmp_path / "data" / "a" / "b").exists()  # delivered files stay
    # a manifest whose whole-file digest is wrong: every chunk passes, the file does not
    bad = Manifest(**{**m.__dict__, "id": "t2", "sha256": "0" * 64})
    r2 = Receiver.open(bad, tmp_path / "st", tmp_path / "data2")
    for i, c in enumerate(chunks):
        r2.add(i, c)
    assert "whole-file sha256 mismatch" in r2.finish()
    assert not (tmp_path / "data2" / "a" / "b").exists()
    r2.close()
    for dest in ("../x", "a/../../x", "", "dir/"):
        with pytest.raises(TransferError, match="DEST"):
            Manifest.from_json({**m.to_json(), "dest": dest})


@pytest.mark.asyncio
async def test_audit_lines_are_info(caplog: pytest.LogCaptureFixture) -> None:
    """An exec or a broadcast is audited at INFO: it is the normal course, not a warning."""
    import logging

    from fluxnetes.agent.authz import Identity, LocalAuthorizer

    caplog.set_level(logging.DEBUG, logger="fluxnetes.agent.audit")
    await LocalAuthorizer().audit(Identity("alice", ("fluxnetes:client",), "certificate"), "exec", "n0", "true")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "audit: user alice (certificate) exec on n0: true")]


@pytest.mark.asyncio
async def test_an_answer_lost_on_the_way_up_is_sent_again_after_a_re_attach(tmp_path: Path) -> None:
    """A chain node000 <- node001 <- node002. node002's exec answer is lost at node001 (as
    when it sat in a connection that then broke, or in an agent that then left); once node002
    re-attaches it sends its answers again and rank 0 gets it: the request does not wait
    for its timeout, and reports node002's real exit code."""
    s = Swarm(tmp_path, 3, fanout=1)
    await s.start_all()
    try:
        await until(lambda: len(s.root.attached) == 3)
        relay, leaf = s.agents["node001"], s.agents["node002"]
        dropped: list[str] = []
        on_up = relay.children.on_up

        def lossy(child: str, h: dict[str, Any]) -> None:
            if h.get("t") == "exec_result" and h.get("node") == "node002" and not dropped:
                dropped.append(str(h["id"]))
                return
            on_up(child, h)

        relay.children.on_up = lossy  # type: ignore[method-assign]
        task = asyncio.ensure_future(s.client.exec(["sh", "-c", "exit 3"], None, 600))
        await until(lambda: bool(dropped), timeout=30)
        assert not task.done()
        before = leaf.up.attach_count
        assert leaf.up.link is not None
        leaf.up.link.close()  # the link breaks: node002 attaches again
        await until(lambda: leaf.up.attach_count > before, timeout=30)
        reply = await asyncio.wait_for(task, 60)
        assert reply["missing"] == {}
        assert [(r["node"], r["returncode"]) for r in reply["results"]] == [
            ("node000", 3), ("node001", 3), ("node002", 3)]
        await until(lambda: not leaf.downward.answers)  # the request's end reached it: nothing kept
    finally:
        await s.stop_all()


@pytest.mark.asyncio
async def test_an_agent_that_leaves_the_membership_detaches_even_if_its_reader_missed_the_cancel(
        tmp_path: Path) -> None:
    """The wedge of issue #29 item 5: a node deleted while a broadcast streams through its
    agent. Its link reader is cancelled just as a frame completes, and on Python 3.11
    asyncio.wait_for can then lose the cancellation: the reader read on from the old parent
    and the agent, waiting for it, never detached (its parent kept it as a child, rank 0 kept
    it attached). Here the reader loses the cancellation on purpose, every time."""
    s = Swarm(tmp_path, 3, fanout=1)
    await s.start_all()
    try:
        await until(lambda: len(s.root.attached) == 3)
        relay, leaf = s.agents["node001"], s.agents["node002"]
        read_parent = leaf.up._read_parent

        async def deaf(link: Any) -> None:
            try:
                await read_parent(link)
            except asyncio.CancelledError:
                await read_parent(link)  # the cancellation is lost: it reads on

        leaf.up._read_parent = deaf  # type: ignore[method-assign]
        before = leaf.up.attach_count
        assert leaf.up.link is not None
        leaf.up.link.close()  # re-attach, now with the deaf reader
        await until(lambda: leaf.up.attach_count > before and leaf.parent_name == "node001")
        s.set_members([m for m in s.members if m.name != "node002"])
        await until(lambda: leaf.parent_name is None, timeout=60)
        await until(lambda: "node002" not in relay.children.links and s.root.attached == {"node000", "node001"},
                    timeout=60)
    finally:
        await s.stop_all()
