"""What-if: the same trace on a rack machine, under several placements and queue policies.

The queue engine (the operator's Scheduler and graph matcher) replays an SWF trace on
``--nodes`` x ``--cores`` split over ``--racks`` racks, for every queue policy and every
placement:

* ``first``: per-core requests (``slot[P] -> core[1]``), match policy ``first``;
* ``lonodex``: per-core requests, match policy ``lonodex`` (each node taken whole);
* ``whole-nodes``: whole-node requests (``node[N] (exclusive) -> slot -> core``), ``first``;
* ``rack-packed``: whole-node requests, a job whose nodes one rack holds asks for them under
  ``rack[1]`` (``--whole-nodes --pack racks``), ``first``.

Per run: jobs spread over racks (multi-node jobs spanning > 1 rack, mean racks and the
excess over the fewest possible), fragmentation (``sim/topology.py``: free cores on part-used
nodes, cores held beyond the request, free cores outside the freest rack), mean wait, mean
bounded slowdown (AVEbsld), utilization, and the run's CPU seconds; the machine's load
average at start and end. Writes ``bench/results/topology_whatif.json``:

    .venv/bin/python bench/topology_whatif.py [--limit 10000] [--nodes 25 --cores 4 --racks 5]

Every row is the same as ``fluxnetes simulate --limit L --nodes N --cores C --racks R
--policy P [--match-policy lonodex | --whole-nodes [--pack racks]] --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from fluxnetes.sim.machine import machine_from_size
from fluxnetes.sim.runner import bundled_trace, policy_for, prepare, run_policy
from fluxnetes.sim.swf import read_swf
from fluxnetes.sim.topology import fragmentation, rack_spread, racks_of

# name -> (match policy, whole nodes, pack racks)
PLACEMENTS: dict[str, tuple[str, bool, bool]] = {
    "first": ("first", False, False),
    "lonodex": ("lonodex", False, False),
    "whole-nodes": ("first", True, False),
    "rack-packed": ("first", True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=None, help="SWF trace (default: KTH-SP2)")
    ap.add_argument("--limit", type=int, default=10000, help="first N records (0 = all)")
    ap.add_argument("--nodes", type=int, default=25)
    ap.add_argument("--cores", type=int, default=4)
    ap.add_argument("--racks", type=int, default=5)
    ap.add_argument("--policies", default="easy,conservative")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/topology_whatif.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    path = args.trace or bundled_trace()
    trace = read_swf(path)
    results: list[dict[str, Any]] = []
    for placement in args.placements.split(","):
        match_policy, whole, pack = PLACEMENTS[placement]
        machine = machine_from_size(args.nodes, args.cores, whole_nodes=whole, racks=args.racks)
        if pack:
            machine.set_pack("rack")
        workload = prepare(trace, machine, limit=args.limit or None)
        rack_of = racks_of(machine.graph)
        for policy in args.policies.split(","):
            cpu0 = time.process_time()
            run, summary = run_policy(workload, policy_for(policy), match_policy=match_policy)
            cpu = time.process_time() - cpu0
            row = {"placement": placement, "policy": policy, "match_policy": match_policy,
                   "whole_nodes": whole, "pack": "racks" if pack else "none",
                   "jobs": summary.jobs, "not_run": summary.rejected,
                   "mean_wait": round(summary.mean_wait, 1),
                   "mean_bsld": round(summary.mean_bsld, 4),
                   "utilization": round(summary.utilization, 4),
                   "racks": rack_spread(run.outcomes, rack_of),
                   "fragmentation": fragmentation(run.outcomes, machine.node_cores(), rack_of),
                   "cpu_seconds": round(cpu, 2), "load_1m": round(os.getloadavg()[0], 2)}
            results.append(row)
            r, f = row["racks"], row["fragmentation"]
            print(f"{placement:12} {policy:13} wait {row['mean_wait']:>9,.0f} s  AVEbsld "
                  f"{row['mean_bsld']:8.2f}  spanning {r.get('spanning_share', 0) * 100:5.1f} %  "
                  f"racks {r.get('mean_racks', 0):.2f} (+{r.get('mean_excess_racks', 0):.2f})  "
                  f"stranded {f['stranded_core_share'] * 100:4.1f} %  unused {f['held_unused_share'] * 100:4.1f} %  "
                  f"rack frag {f.get('rack_fragmentation', 0) * 100:4.1f} %  cpu {cpu:.1f} s",
                  flush=True)
    out = {
        "bench": "topology_whatif",
        "parameters": {"trace": path.name, "limit": args.limit, "nodes": args.nodes,
                       "cores": args.cores, "racks": args.racks, "filter": "published-studies",
                       "estimate": "requested", "reservations": "counted", "engine": "queue",
                       "placements": {k: {"match_policy": v[0], "whole_nodes": v[1],
                                          "pack": "racks" if v[2] else "none"}
                                      for k, v in PLACEMENTS.items()}},
        "results": results,
        "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform(),
                    "loadavg_at_start": list(load0), "loadavg_at_end": list(os.getloadavg())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
