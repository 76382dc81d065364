"""Where the operator's CPU goes per pod: py-spy's collapsed stacks split by stage and by work.

Reads the files `bench/operator_bench.py --profile-operator DIR` writes (py-spy ``--format raw
--gil``: one line per distinct stack, its sample count last) and splits the samples two ways:

- **stage**: the operator step a sample is in (placing pods, phase changes with their log
  lines, Events, FluxJob writes, the rest of the scheduling cycle, handling a Pod / Job / Node
  event, reading the watch streams, the webhook's process, ...): the first rule, in order, one
  of its frames matches;
- **work**: what the sample does at its innermost frames (logging, metrics, JSON, HTTP/TLS,
  the matcher, plain Python): the first rule matched going from the leaf up.

py-spy samples Python frames only: C code (orjson's loads and dumps, ssl) counts in the
Python frame that called it (a watch line's decode is in ``Kube.watch``).

    .venv/bin/python bench/operator_profile_split.py --pods 300 DIR/operator-after-single_pod_jobs-0.txt

Prints JSON; ``--output FILE`` writes it there too.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

# uvloop's loop is C code: a sample taken in it (GIL held: polling, socket reads, TLS records,
# timers) has the loop's runner as its innermost Python frame, where asyncio's shows
# base_events.py / selectors.py
UVLOOP_LEAF = r"Runner\.run \(asyncio/runners\.py"


# a sample's stage: the first rule (in this order) one of its frames matches; the writes and
# phase changes come first so that they count as theirs wherever they are called from
STAGES: list[tuple[str, str]] = [
    ("webhook process", r"_serve_child|spawn_main|admission/webhook\.py"),
    ("placing pods (patch / Binding)", r"Allocation\.place|placement\.py"),
    ("phase changes (set_phase: log, metrics, store)", r"StatusWriter\.set_phase"),
    ("Event objects", r"StatusWriter\.(event|group_event)"),
    ("FluxJob writes (flush)", r"StatusWriter\.(flush_fluxjobs|_flush_once|write_fluxjob)|persistence/fluxjob\.py"),
    ("scheduling cycle (the rest of it)", r"SchedulingCycle\.run_cycle"),
    ("Pod events (on_pod, the rest of it)", r"Controller\.on_pod"),
    ("Job / workload events (on_owner)", r"Controller\.on_owner|owner_changed"),
    ("Node events", r"ClusterView\.on_node|know_node"),
    ("other events (handle)", r"Controller\.handle"),
    ("reading the watch streams (incl. JSON decode)", r"Kube\.watch|Informer\.run"),
    ("other API requests (incl. JSON)", r"Kube\.(request|_send)"),
    ("leader lease", r"leader\.py"),
    ("asyncio loop (socket reads, TLS records, timers)", r"base_events\.py|selectors\.py"),
]
LOOP_STAGE = STAGES[-1][0]  # uvloop's samples count there too (see UVLOOP_LEAF)

# what a sample does: the first rule matched going from the leaf up its stack
WORK: list[tuple[str, str]] = [
    ("logging", r"logging/|fluxnetes/logging\.py"),
    ("metrics", r"prometheus_client|fluxnetes/metrics\.py"),
    ("HTTP / TLS (aiohttp, ssl)", r"aiohttp/|sslproto\.py|ssl\.py|selector_events\.py"),
    ("JSON decode of watch lines (orjson)", r"Kube\.watch"),
    ("matcher", r"fluxnetes/match/|fluxnetes/graph/"),
    ("queue", r"fluxnetes/queue/|fluxnetes/plan/"),
    ("copying / deep-copying", r"copy\.py"),
]


def samples(path: Path) -> list[tuple[int, list[str]]]:
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            out.append((int(count), stack.split(";")))
    return out


def stage_of(frames: list[str]) -> str:
    for name, rule in STAGES:
        if any(re.search(rule, f) for f in frames):
            return name
    if frames and re.search(UVLOOP_LEAF, frames[-1]):
        return LOOP_STAGE
    return "other"


def work_of(frames: list[str]) -> str:
    if frames and re.search(UVLOOP_LEAF, frames[-1]):
        return "event loop (uvloop's, in C)"
    for f in reversed(frames):
        for name, rule in WORK:
            if re.search(rule, f):
                return name
    return "python (the operator's own code)"


def split(files: list[Path], pods: int, rate: float) -> dict[str, Any]:
    by_stage: Counter[str] = Counter()
    by_work: Counter[str] = Counter()
    total = 0
    for path in files:
        for n, frames in samples(path):
            total += n
            by_stage[stage_of(frames)] += n
            by_work[work_of(frames)] += n

    def table(c: Counter[str]) -> dict[str, dict[str, float]]:
        return {k: {"samples": v, "share": round(v / total, 3), "ms_per_pod": round(1000 * v / rate / pods, 2)}
                for k, v in c.most_common()}

    return {"files": [str(f) for f in files], "pods": pods, "rate_hz": rate, "samples": total,
            "cpu_s": round(total / rate, 2), "ms_per_pod": round(1000 * total / rate / pods, 2),
            "by_stage": table(by_stage), "by_work": table(by_work)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--pods", type=int, required=True, help="pods the profiled runs placed (all files together)")
    ap.add_argument("--rate", type=float, default=50, help="py-spy's sampling rate (operator_bench: 50)")
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    out = split(args.files, args.pods, args.rate)
    text = json.dumps(out, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
