"""The chaos soak: does the operator keep its promises while its world breaks?

    .venv/bin/python bench/chaos.py --minutes 30 --faults-each 20     # the long form (issue #11)
    .venv/bin/python bench/chaos.py --short                           # CI's form, ~3 minutes

A stream of mixed work (single gated pods, Jobs, gang Jobs, label groups, Deployments scaled up
and down) runs in two opted-in namespaces on kwok nodes of a fresh dev cluster, scheduled by
two operator replicas (leader and follower, one Lease) sharing a private PostgreSQL store.
At seeded random moments the leader is SIGKILLed (and restarted as the follower), a node with
running work is deleted and another added, PostgreSQL is restarted, and the API server is
restarted with etcd kept. `fluxnetes.devcluster.invariants` checks the cluster about once a
second (no overbooked node, no partially bound group, FluxJob shares = bound pods, no Job run
twice, nothing bypassing the queue); at the end the queue must drain and a gang asking every
core of every node must start (no capacity leaked). Writes bench/results/chaos.json
(chaos_short.json for --short) with the parameters, the faults (kind, time, time to the next
bind), the workloads (submitted, finished, failed with a reason, lost, duplicated) and every
violation with its evidence and the fault that preceded it. Exit status 1 when anything was
violated, lost or duplicated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fluxnetes.devcluster.chaos import FAULT_KINDS, Soak, SoakOptions, write_result

RESULTS = Path(__file__).resolve().parent / "results"

SHORT: dict[str, float] = {"minutes": 2.0, "faults_each": 1, "nodes": 20, "arrival": 1.5, "drain": 150.0,
         "warmup": 15.0, "cooldown": 25.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true",
                    help="CI's form: 2 minutes, 20 nodes, one fault of each kind")
    ap.add_argument("--minutes", type=float, help="length of the stream (default 30)")
    ap.add_argument("--faults-each", type=int, help="faults of each kind (default 20)")
    ap.add_argument("--nodes", type=int, help="kwok nodes (default 50)")
    ap.add_argument("--node-cpu", type=int, default=8, help="cpu per node (memory: 4 GiB per cpu)")
    ap.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    ap.add_argument("--arrival", type=float, help="mean seconds between submissions (default 1)")
    ap.add_argument("--group-grace", type=float, default=20.0,
                    help="seconds a group may stay partially bound: a leader killed while it places a "
                         "gang's pods leaves some placed until the next leader (lease 10 s + start) ends it")
    ap.add_argument("--share-grace", type=float, default=30.0,
                    help="seconds a FluxJob's shares may differ from its bound pods")
    ap.add_argument("--drain", type=float, help="seconds the queue has to drain at the end (default 300)")
    ap.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds to inject")
    ap.add_argument("--store", default="postgres",
                    help="'postgres' (a private server, restarted by the faults) or a store URL")
    ap.add_argument("--operator-arg", action="append", default=[],
                    help="extra argument for `fluxnetes run` (repeat; e.g. --operator-arg=--placement=bind)")
    ap.add_argument("--cluster-dir", type=Path, help="use this running dev cluster instead of a new one")
    ap.add_argument("--work-dir", type=Path, help="keep the cluster, logs and operator logs here")
    ap.add_argument("--no-probe", action="store_true", help="skip the final capacity probe")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/chaos[_short].json)")
    args = ap.parse_args(argv)

    base: dict[str, float] = SHORT if args.short else {"minutes": 30.0, "faults_each": 20, "nodes": 50, "arrival": 1.0,
                                     "drain": 300.0, "warmup": 20.0, "cooldown": 30.0}

    def pick(name: str, key: str) -> float:
        value = getattr(args, name)
        return float(base[key] if value is None else value)

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        ap.error(f"--kinds: unknown {', '.join(unknown)} (known: {', '.join(FAULT_KINDS)})")
    opts = SoakOptions(
        minutes=float(pick("minutes", "minutes")),
        faults_each=int(pick("faults_each", "faults_each")),
        nodes=int(pick("nodes", "nodes")),
        node_cpu=args.node_cpu,
        seed=args.seed,
        arrival_seconds=float(pick("arrival", "arrival")),
        group_grace=args.group_grace,
        share_grace=args.share_grace,
        drain_seconds=float(pick("drain", "drain")),
        warmup_seconds=float(base["warmup"]),
        cooldown_seconds=float(base["cooldown"]),
        store=args.store,
        operator_args=tuple(args.operator_arg),
        kinds=kinds,
        cluster_dir=args.cluster_dir,
        work_dir=args.work_dir,
        probe=not args.no_probe,
    )
    result = Soak(opts).run()
    out = args.out or RESULTS / ("chaos_short.json" if args.short else "chaos.json")
    write_result(result, out)
    w = result["workloads"]
    print(f"faults injected: {result['faults_injected']}; workloads: {w['submitted']} submitted, "
          f"{w['finished']} finished, {w['failed_with_reason']} failed with a reason, {w['lost']} lost, "
          f"{w['duplicated']} duplicated; violations: {result['violation_counts'] or 0}; "
          f"probe: {'ok' if result['probe'].get('ok') else result['probe'] or 'skipped'}")
    print(f"wrote {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
