"""Cost of fair share per scheduling cycle (fluxnetes.queue.priority.FairShare).

For each (accounts, queued jobs): a flat tree of users (and a two-level tree: 10 accounts
of users) with usage from 20,000 past jobs; then cycles, each after one job start and one
job end (so the factors are recomputed every cycle): ``held`` + ``order`` over the whole
queue. Reports ms per cycle for each part, µs per usage event, and the node reads per
cycle (must equal the tree size: the cost does not grow with the history).

Run:  .venv/bin/python bench/fairshare_bench.py [--cycles 20] [--out bench/results/fairshare_bench.json]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.queue.accounts import AccountTree
from fluxnetes.queue.priority import FairShare, FairShareConfig


@dataclass
class Spec:
    totals: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    id: str
    jobspec: Any
    submit_time: int
    priority: int = 0
    account: str = ""


def tree_for(users: int, two_level: bool) -> AccountTree:
    names = [f"u{i}" for i in range(users)]
    if not two_level:
        return AccountTree.flat(names)
    accounts: dict[str, Any] = {f"acct{k}": {"shares": k + 1, "users": [],
                                              "limits": {"max_running_cores": 10**6}}
                                for k in range(10)}
    for i, name in enumerate(names):
        accounts[f"acct{i % 10}"]["users"].append(name)
    return AccountTree.from_dict({"accounts": accounts})


def run(users: int, queued: int, two_level: bool, cycles: int, algorithm: str) -> dict[str, Any]:
    tree = tree_for(users, two_level)
    fs = FairShare(tree, FairShareConfig(algorithm=algorithm, half_life=7 * 86400,  # type: ignore[arg-type]
                                         total_cores=1000))
    history = 20000
    t0 = time.perf_counter()
    for i in range(history):
        j = Job(f"h{i}", Spec({"core": 1 + i % 16}), i, 0, f"u{i % users}")
        fs.record_start(j, i)
        fs.record_end(j, i + 600)
    event_us = (time.perf_counter() - t0) / (2 * history) * 1e6
    queue = [Job(str(i), Spec({"core": 1 + i % 32}), history + i, i % 3, f"u{(i * 7) % users}")
             for i in range(queued)]
    now = history + queued + 1000
    t_held = t_order = 0.0
    reads0 = fs.usage.node_reads
    for c in range(cycles):
        j = queue[c]
        fs.record_start(j, now + c)
        fs.record_end(j, now + c + 1)
        t = time.perf_counter()
        held = fs.held([], queue, now + c)
        t_held += time.perf_counter() - t
        t = time.perf_counter()
        fs.order([q for q in queue if q.id not in held], now + c)
        t_order += time.perf_counter() - t
    return {
        "algorithm": algorithm, "users": users, "tree_nodes": len(tree), "two_level": two_level,
        "queued": queued, "history_jobs": history, "cycles": cycles,
        "usage_event_us": round(event_us, 2),
        "held_ms_per_cycle": round(t_held / cycles * 1e3, 2),
        "order_ms_per_cycle": round(t_order / cycles * 1e3, 2),
        "node_reads_per_cycle": (fs.usage.node_reads - reads0) / cycles,
    }


def main() -> None:
    args = sys.argv[1:]
    cycles = int(args[args.index("--cycles") + 1]) if "--cycles" in args else 20
    out = Path(args[args.index("--out") + 1]) if "--out" in args else Path("bench/results/fairshare_bench.json")
    results = []
    for algorithm in ("fair_tree", "classic"):
        for users, queued, two_level in ((10, 1000, False), (300, 1000, True), (300, 10000, True),
                                         (3000, 10000, True)):
            row = run(users, queued, two_level, cycles, algorithm)
            print(json.dumps(row))
            results.append(row)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    doc = {"bench": "fairshare_bench", "results": results,
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform(), "loadavg_at_end": load}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
