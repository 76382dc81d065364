"""Broadcast through the agents' tree vs. every node pulling from one source (issue 14).

Agents: asyncio tasks in one process on 127.0.0.1, each a full agent (own TLS certificate,
server, parent link, staging file, data directory). Why tasks and not processes: 256 Python
processes need ~10 GB of memory and on this 2-core machine would mostly measure the OS
scheduler; in one process the total work (TLS, sha256, writes) is the same, done on one core.

Layouts, same code, same file:
- ``pull``: fanout >= N, a star: rank 0 (the source) sends a copy to every node, which is
  what N nodes pulling from one source cost that source's uplink;
- ``tree``: fanout ``--fanout`` (default 4): interior agents forward to their children.

A 2-core loopback has no per-node NIC: unpaced, both layouts are bound by the same total CPU
work and the tree cannot win. So each agent's sending is paced to ``--rate`` MiB/s (a
token bucket over the bytes it sends to all its children), standing in for its uplink; with
that, the source's uplink carries N copies in ``pull`` and ``fanout`` copies in ``tree``.
The figures therefore show the topology effect under a modelled NIC, not real network
throughput. ``--unpaced`` adds an unpaced run (default: 16 agents, 200 MB) for the CPU-bound
picture.

Run:  .venv/bin/python bench/agent_broadcast.py [--sizes 16,64,256] [--rate 2] [--total-mib 64] [--unpaced]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from fluxnetes.agent import tls
from fluxnetes.agent.client import Client
from fluxnetes.agent.overlay import Agent, AgentConfig
from fluxnetes.agent.tree import Member, Tree

MIB = 1024 * 1024
OUT = Path(__file__).parent / "results" / "agent_broadcast.json"


def _ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out


async def run_once(base: Path, n: int, fanout: int, size: int, chunk: int, rate: float | None) -> dict[str, Any]:
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    ca = tls.make_ca(base / "ca")
    members = [Member(f"n{i:04d}", "127.0.0.1", p) for i, p in enumerate(_ports(n))]
    tree = Tree.build(members, fanout)
    agents = []
    for m in members:
        d = base / m.name
        cfg = AgentConfig(node=m.name, certs=tls.issue(ca, d / "tls", m.name), state_dir=d / "state",
                          data_dir=d / "data", listen_host="127.0.0.1", listen_port=m.port, fanout=fanout,
                          dead_after=120.0, send_timeout=600.0, upload_rate=rate)
        agent = Agent(cfg, tree)
        await agent.start()
        agents.append(agent)
    try:
        t0 = time.monotonic()
        while len(agents[0].attached) < n:
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"only {len(agents[0].attached)} of {n} agents joined")
            await asyncio.sleep(0.05)
        join_s = time.monotonic() - t0
        src = base / "payload.bin"
        with src.open("wb") as f:
            for _ in range(size // MIB):
                f.write(os.urandom(MIB))
            f.write(os.urandom(size % MIB))
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        client = Client(members[0].address, certs=tls.issue(ca, base / "client", "bench", org=tls.CLIENT_ORG))
        load_before = os.getloadavg()
        cpu0 = time.process_time()
        t1 = time.monotonic()
        out = await client.broadcast(src, "payload.bin", None, chunk_size=chunk)
        wall = time.monotonic() - t1
        cpu = time.process_time() - cpu0
        ok = sum(1 for m in members
                 if hashlib.sha256((base / m.name / "data" / "payload.bin").read_bytes()).hexdigest() == digest)
        return {"agents": n, "fanout": fanout, "depth": tree.depth(), "bytes": size, "chunk": chunk,
                "rate_mib_s": None if rate is None else rate / MIB, "join_s": round(join_s, 3),
                "broadcast_s": round(wall, 3), "process_cpu_s": round(cpu, 3),
                "aggregate_mib_s": round(size * n / MIB / wall, 1), "verified_nodes": ok,
                "missing": out["missing"], "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    finally:
        for a in agents:
            await a.stop()
        shutil.rmtree(base, ignore_errors=True)


def main(
    sizes: Annotated[str, typer.Option(help="Agent counts.")] = "16,64,256",
    fanout: Annotated[int, typer.Option(help="Fanout of the tree layout.")] = 4,
    rate: Annotated[float, typer.Option(help="Per-agent send pacing, MiB/s (the modelled NIC).")] = 2.0,
    total_mib: Annotated[int, typer.Option(help="File size x agents, MiB (file = total / agents).")] = 64,
    chunk_kib: Annotated[int, typer.Option(help="Chunk size, KiB.")] = 128,
    unpaced: Annotated[bool, typer.Option(help="Also an unpaced run (CPU-bound picture).")] = False,
    unpaced_agents: Annotated[int, typer.Option()] = 16,
    unpaced_mb: Annotated[int, typer.Option(help="Unpaced file size, MB (10^6 bytes).")] = 200,
    out: Annotated[Path, typer.Option()] = OUT,
    keep_unpaced: Annotated[bool, typer.Option(
        help="Keep the unpaced runs already in OUT (they take minutes) instead of re-running them.")] = False,
) -> None:
    logging.basicConfig(level=logging.ERROR)
    base = Path(tempfile.mkdtemp(prefix="fluxnetes-bench-agent-"))
    runs: list[dict[str, Any]] = []
    if keep_unpaced and not unpaced and out.exists():
        for r in json.loads(out.read_text()).get("runs", []):
            if r.get("rate_mib_s") is None:
                runs.append({**r, "from_earlier_invocation": True})
    try:
        for n in [int(x) for x in sizes.split(",")]:
            size = total_mib * MIB // n
            for layout, k in (("tree", fanout), ("pull", max(n, 1))):
                r = asyncio.run(run_once(base / "run", n, k, size, chunk_kib * 1024, rate * MIB))
                r["layout"] = layout
                runs.append(r)
                print(json.dumps(r), file=sys.stderr)
        if unpaced:
            for layout, k in (("tree", fanout), ("pull", unpaced_agents)):
                r = asyncio.run(run_once(base / "run", unpaced_agents, k, unpaced_mb * 10 ** 6, MIB, None))
                r["layout"] = layout
                runs.append(r)
                print(json.dumps(r), file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    speedups = {}
    for n in {r["agents"] for r in runs if r["rate_mib_s"]}:
        t = next(r for r in runs if r["agents"] == n and r["layout"] == "tree" and r["rate_mib_s"])
        p = next(r for r in runs if r["agents"] == n and r["layout"] == "pull" and r["rate_mib_s"])
        speedups[str(n)] = round(p["broadcast_s"] / t["broadcast_s"], 2)
    result = {
        "benchmark": "agent_broadcast",
        "what": "time to broadcast one file to N agents (all chunks sha256-verified, whole file verified, "
                "moved into place on every node) through the tree vs a star (every node served by the source)",
        "agents_are": "asyncio tasks in one process on 127.0.0.1 (each a full agent with TLS, own dirs)",
        "parameters": {"sizes": sizes, "tree_fanout": fanout, "rate_mib_s_per_agent": rate,
                       "file_mib_times_agents": total_mib, "chunk_kib": chunk_kib,
                       "unpaced": {"agents": unpaced_agents, "mb": unpaced_mb} if unpaced or keep_unpaced else None},
        "pull_over_tree_speedup": speedups,
        "runs": runs,
        "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform(), "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "note": "The per-agent pacing models each node's uplink; on this 2-core loopback the bytes move "
                "through memory and one core does all agents' TLS, hashing and writes. The pull/tree ratio "
                "shows the topology effect under that model (the source's uplink carries N copies vs "
                "fanout copies); absolute times are not network throughput. Unpaced runs are CPU-bound "
                "and show no tree advantage on one machine.",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"speedup_pull_over_tree": speedups}, indent=2))


if __name__ == "__main__":
    typer.run(main)
