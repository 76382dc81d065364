"""How long `fluxnetes dev cluster up` takes, by phase, for a few node counts.

    .venv/bin/python bench/devcluster_up.py [--nodes 10 1000] [--repeat 1]

Writes bench/results/devcluster_up.json. Needs the binaries of hack/build-k8s.sh. Each run
starts a fresh cluster in a temporary directory and stops it again (down time is recorded too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape, toolchain


def one_run(count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fluxnetes-bench-") as d:
        start = time.monotonic()
        cluster = Cluster.up(
            ClusterOptions(
                nodes=NodeShape(count=count, cpu="32", memory="256Gi", gpus=8, zones=4, racks=8),
                dir=Path(d),
                timeout=900,
                die_with_parent=True,
            )
        )
        total = time.monotonic() - start
        stop = time.monotonic()
        cluster.down()
        return {
            "total_s": round(total, 2),
            **{f"{k}_s": round(v, 2) for k, v in cluster.timings.items()},
            "down_s": round(time.monotonic() - stop, 2),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "devcluster_up.json"
    )
    args = ap.parse_args()
    if toolchain().missing():
        print("binaries missing: run `bash hack/build-k8s.sh` first", file=sys.stderr)
        return 1
    results = []
    for count in args.nodes:
        for i in range(args.repeat):
            r = one_run(count)
            print(f"nodes={count} run={i}: {r}", flush=True)
            results.append({"nodes": count, "run": i, **r})
    doc = {
        "benchmark": "devcluster_up",
        "parameters": {
            "nodes": args.nodes,
            "repeat": args.repeat,
            "shape": "32 cpu, 256Gi, 8 gpu, 4 zones x 8 racks",
        },
        "results": results,
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "note": "the machine is shared; load_avg_at_end shows how busy it was",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
