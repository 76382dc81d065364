"""What the allocation note (k8s/scheduling/allocation_note.py) costs each placement of a
multi-pod group: the note's bytes, the placement patch's bytes with and without it, and the
operator's CPU to build (and serialize) the patch with and without it (paired, alternating,
in one run), the note's making (once per allocation), plus the recovery side (decode + ``held_after``) per group. No API write is added (the note rides
on the placement patch the pod gets anyway); what grows is each patch's body (sent to the API
server, stored in etcd with the pod).

Run:  PYTHONPATH=src .venv/bin/python bench/allocation_note_cost.py [--out bench/results/allocation_note_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.scheduling import allocation_note
from fluxnetes.k8s.scheduling.placement import place_patch
from fluxnetes.k8s.scheduling.shares import Share

RESULTS = Path(__file__).resolve().parent / "results"
# (pods, nodes): a gang on whole nodes, pods packed several a node, a wide group
SHAPES = [(2, 2), (4, 4), (8, 2), (16, 16), (32, 4), (64, 64), (128, 128), (256, 32)]


def gated_pod(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"worker-{i}", "namespace": "team-a", "uid": f"uid-{i:08d}",
                         "labels": {names.LABEL_MANAGED: "true", "job-name": "worker"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(i)}},
            "spec": {"schedulingGates": [{"name": names.GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]}}


def shape(pods: int, nodes: int) -> tuple[list[str], list[Share]]:
    per = pods // nodes
    held = [Share(f"kwok-node-{n:04d}", 4 * per, 0, 4096 * per) for n in range(nodes)]
    slots = sorted(s.node for s in held for _ in range(per))
    return slots, held


def per_call_us(fn: Any, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


def measure(pods: int, nodes: int, rounds: int) -> dict[str, Any]:
    slots, held = shape(pods, nodes)
    note = allocation_note.encode(12345, slots, held)
    pod = gated_pod(0)
    plain = place_patch(pod, slots[0], jobid=12345, fluxjob="job-worker", slot=0)
    withnote = place_patch(pod, slots[0], jobid=12345, fluxjob="job-worker", slot=0, allocation=note)
    reps = max(50, 20000 // pods)
    without_us: list[float] = []
    with_us: list[float] = []
    for r in range(rounds):  # paired, alternating which goes first
        def a() -> None:
            json.dumps(place_patch(pod, slots[0], jobid=12345, fluxjob="job-worker", slot=0))

        def b() -> None:  # (the note is made once per allocation: Group.alloc_note)
            json.dumps(place_patch(pod, slots[0], jobid=12345, fluxjob="job-worker", slot=0, allocation=note))

        first, second = (a, b) if r % 2 == 0 else (b, a)
        x, y = per_call_us(first, reps), per_call_us(second, reps)
        without_us.append(x if first is a else y)
        with_us.append(y if first is a else x)
    encode_once_us = per_call_us(lambda: allocation_note.encode(12345, slots, held), reps)
    decode_us = per_call_us(lambda: allocation_note.held_after(allocation_note.decode(note or "") or
                                                               allocation_note.PlacedAllocation("", (), ()), {0}),
                            reps) if note else None
    plain_bytes, note_bytes = len(json.dumps(plain)), len(json.dumps(withnote))
    return {"pods": pods, "nodes": nodes, "note_chars": len(note) if note else None,
            "note_written": note is not None,
            "patch_bytes_without": plain_bytes, "patch_bytes_with": note_bytes,
            "extra_bytes_per_group": (note_bytes - plain_bytes) * pods,
            "build_patch_us_without_median": sorted(without_us)[len(without_us) // 2],
            "build_patch_us_with_median": sorted(with_us)[len(with_us) // 2],
            "encode_once_per_group_us": encode_once_us,
            "recover_decode_us": decode_us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=RESULTS / "allocation_note_cost.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    rows = [measure(p, n, args.rounds) for p, n in SHAPES]
    out = {"bench": "allocation_note_cost", "rounds": args.rounds, "max_chars": allocation_note.MAX_CHARS,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['pods']:4d} pods on {r['nodes']:4d} nodes: note {r['note_chars']} chars, patch "
              f"{r['patch_bytes_without']} -> {r['patch_bytes_with']} B, build {r['build_patch_us_without_median']:.1f}"
              f" -> {r['build_patch_us_with_median']:.1f} us, note made once {r['encode_once_per_group_us']:.0f} us, "
              f"recovery decode {r['recover_decode_us'] or 0:.0f} us")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
