"""The operator's in-process costs at 1,000 and 5,000 nodes (no control plane needed).

For each node count, in a fresh subprocess (so RSS is per size):

* the Node objects the dev cluster creates (devcluster/nodes.py, default `dev cluster up`
  shape: 32 cpu, 256Gi, one zone, one rack), as kwok reports them (Ready condition added);
* build: Node dicts -> resource graph (the operator's path: graph.topology
  .from_k8s_nodes_topology, which k8s/topology.build_graph calls) -> Matcher (policy lonode,
  the operator's default); seconds and RSS growth;
* the first allocate after the build also builds the matcher's fast slot index (match/slotindex.py):
  it is reported separately ("first_ms"), as the operator pays it on its first match after a
  start or a graph rebuild;
* on an empty graph and on two 90%-full graphs, the time of one `allocate` of a 1-pod group and
  of a 10-pod group (1 cpu, 64Mi each, as operator_bench's Jobs), as the operator asks
  (a parsed Jobspec from jobspec_from_pods): the first call and the median/p99 of repeats
  (each allocation is cancelled again, so the state stays the same);
  - "spread90": every node has 29 of 32 cores used (90.6%): the backlog case of issue 17;
  - "spread90_pod_jobs": the same, one matcher job per pod (as the operator records pods),
    so the matcher holds 5,000 jobs rather than 50 groups;
  - "packed90": 90% of the nodes are full, 10% empty;
* a failing `allocate_orelse_reserve` (and a failing plain `allocate`) on both "spread90": a pod of
  16 cpu (no node has 16 free and nothing running ever ends, so no reservation either), and a
  group of 10 such pods; its cost over a successful 1-pod allocate is the ratio of
  issue 17 item 3 ("a failing match is as cheap as a successful one");
* with --compare-baseline, on the same "spread90" matcher right after: the same questions
  with the matcher's failing-path shortcuts off (``Matcher.fast_fail = False``: a
  satisfiability walk of the whole graph on every failure, "every job active" recomputed
  after a cancel), under "baseline" - before/after from one run.

    .venv/bin/python bench/scale_5000.py [--nodes 1000 5000] [--repeat 50] [--compare-baseline]

Writes bench/results/scale_5000.json (parameters, figures, load average, machine).

"reserve" (see reserve_state): a backlog head that gets a reservation, 1,000 and 5,000 nodes,
running pods of known durations; with --compare-baseline also with ``fast_fail = False`` (a
walk at every candidate start time) on the same state, answers checked equal. Also part of
the full run; alone (merged into the file, other keys kept):

    .venv/bin/python bench/scale_5000.py --reserve-only --repeat 10 --compare-baseline

With --cluster-nodes N it instead runs `fluxnetes dev cluster up --nodes N` (the CLI, default
node shape) in a temporary directory and records, under "dev_cluster" in the same file: the
time to Ready by phase, each component's RSS (now and peak), the CPU each uses while the
cluster idles (30 s), how long `kubectl get nodes` and a one-node LIST take, etcd's data size,
and the time of `down`:

    .venv/bin/python bench/scale_5000.py --cluster-nodes 5000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "scale_5000.json"
POD_CPU_MILLIS = 1000
POD_MEMORY = 64 * 1024 * 1024
FILL_BATCH = 100  # filler groups of 100 pods, one per node
BASELINE_FAIL_REPEAT = 3  # the unoptimised failing path costs seconds per call at 5,000 nodes


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def node_objects(count: int) -> list[dict[str, Any]]:
    """The dev cluster's Node objects as the operator's informer sees them (kwok: Ready)."""
    from fluxnetes.devcluster.nodes import NodeShape

    nodes = NodeShape(count=count).validate().manifests()
    for n in nodes:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    return nodes


def timed(fn: Any) -> tuple[float, float, Any]:
    """(wall ms, this process's CPU ms, result): on a shared machine the CPU time is the cost,
    the wall time also holds the waits for a core."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000, out


def measure(matcher: Any, op: str, js: Any, repeat: int, expect_ok: bool) -> dict[str, Any]:
    """First call and median/p99 of `repeat` more; successful allocations are cancelled."""
    times: list[float] = []
    cpus: list[float] = []
    status = ""
    for _ in range(repeat + 1):
        ms, cpu, res = timed(lambda: getattr(matcher, op)(js, now=0))
        cpus.append(cpu)
        status = res.status.value
        if res.ok != expect_ok:
            raise SystemExit(f"{op}: expected ok={expect_ok}, got {status} ({res.reason})")
        if res.ok and op != "satisfiability":
            matcher.cancel(res.jobid)
        times.append(ms)
    rest = sorted(times[1:])
    return {
        "op": op,
        "status": status,
        "first_ms": round(times[0], 3),
        "median_ms": round(statistics.median(rest), 3),
        "p99_ms": round(rest[min(len(rest) - 1, int(0.99 * len(rest)))], 3),
        "first_cpu_ms": round(cpus[0], 3),
        "median_cpu_ms": round(statistics.median(cpus[1:]), 3),
        "repeat": repeat,
    }


def fill(matcher: Any, count: int, how: str) -> dict[str, Any]:
    from fluxnetes.jobspec import PodRequest, jobspec_from_pods

    batch = FILL_BATCH
    if how.startswith("spread90"):  # one 29-core pod on every node
        pods, cores = count, 29
        if how == "spread90_pod_jobs":
            batch = 1
    else:  # packed90: 90% of the nodes full
        pods, cores = count * 9 // 10, 32
    t0 = time.perf_counter()
    groups = 0
    while pods > 0:
        size = min(batch, pods)
        res = matcher.allocate(jobspec_from_pods(size, PodRequest(cores * 1000, 0), name="fill"), now=0)
        if not res.ok:
            raise SystemExit(f"fill {how}: {res.status.value} ({res.reason})")
        pods -= size
        groups += 1
    used = (count if how.startswith("spread90") else count * 9 // 10) * cores
    return {"fill_s": round(time.perf_counter() - t0, 2), "fill_groups": groups,
            "cores_used_fraction": round(used / (count * 32), 3)}


def one_size(count: int, repeat: int, compare: bool = False) -> dict[str, Any]:
    from fluxnetes.graph.topology import from_k8s_nodes_topology
    from fluxnetes.jobspec import PodRequest, jobspec_from_pods
    from fluxnetes.match.matcher import Matcher

    gc.collect()
    rss0 = rss_mb()
    nodes = node_objects(count)
    rss_nodes = rss_mb()
    t_graph, c_graph, (graph, _) = timed(
        lambda: from_k8s_nodes_topology(nodes, {}, rack_label="fluxnetes.io/rack"))
    rss_graph = rss_mb()
    t_matcher, c_matcher, matcher = timed(lambda: Matcher(graph, policy="lonode"))
    rss_matcher = rss_mb()
    out: dict[str, Any] = {
        "nodes": count,
        "vertices": sum(len(v) for v in graph.by_type.values()),
        "build": {
            "graph_s": round(t_graph / 1000, 3),
            "matcher_s": round(t_matcher / 1000, 3),
            "total_s": round((t_graph + t_matcher) / 1000, 3),
            "total_cpu_s": round((c_graph + c_matcher) / 1000, 3),
            "rss_start_mb": round(rss0, 1),
            "rss_node_dicts_mb": round(rss_nodes - rss0, 1),
            "rss_graph_mb": round(rss_graph - rss_nodes, 1),
            "rss_matcher_mb": round(rss_matcher - rss_graph, 1),
            "rss_after_build_mb": round(rss_matcher, 1),
        },
    }
    pod = PodRequest(POD_CPU_MILLIS, POD_MEMORY)
    one = jobspec_from_pods(1, pod, name="one")
    ten = jobspec_from_pods(10, pod, name="ten")
    big = PodRequest(16_000, POD_MEMORY)
    big_one = jobspec_from_pods(1, big, name="big")
    big_ten = jobspec_from_pods(10, big, name="bigten")

    states: dict[str, Any] = {}
    states["empty"] = {
        "allocate_1pod": measure(matcher, "allocate", one, repeat, True),
        "allocate_10pod": measure(matcher, "allocate", ten, repeat, True),
    }
    for how in ("spread90", "spread90_pod_jobs", "packed90"):
        m = matcher if how == "spread90" else Matcher(graph, policy="lonode")
        st: dict[str, Any] = fill(m, count, how)
        st["allocate_1pod"] = measure(m, "allocate", one, repeat, True)
        st["allocate_10pod"] = measure(m, "allocate", ten, repeat, True)
        if how.startswith("spread90"):
            # failing questions: allocate_orelse_reserve (no node has 16 cores free, nothing
            # ever ends, so no reservation: then the satisfiability question), plain allocate,
            # satisfiability alone. The first call of a new request shape also builds the
            # slot index (slotindex.py) and the empty-graph slot counts (pristine.py): "first_ms".
            for label, js in (("1pod_16cpu", big_one), ("10pod_16cpu", big_ten)):
                st[f"fail_orelse_reserve_{label}"] = measure(m, "allocate_orelse_reserve", js, repeat, False)
                st[f"fail_allocate_{label}"] = measure(m, "allocate", js, repeat, False)
                st[f"satisfiability_{label}"] = measure(m, "satisfiability", js, repeat, True)
            st.update(_ratios(st))
            if compare:
                m.fast_fail = False
                base: dict[str, Any] = {
                    "what": "the same matcher and state, Matcher.fast_fail = False (the failing "
                            "path before issue 17 item 3's work); measured after the rows above, "
                            "so the slot index of each shape is already built (first_ms "
                            "excludes it here)",
                    "allocate_1pod": measure(m, "allocate", one, repeat, True),
                    "allocate_10pod": measure(m, "allocate", ten, repeat, True),
                }
                slow = max(1, min(repeat, BASELINE_FAIL_REPEAT))
                for label, js in (("1pod_16cpu", big_one), ("10pod_16cpu", big_ten)):
                    base[f"fail_orelse_reserve_{label}"] = measure(m, "allocate_orelse_reserve", js, slow,
                                                                   False)
                    base[f"fail_allocate_{label}"] = measure(m, "allocate", js, repeat, False)
                    base[f"satisfiability_{label}"] = measure(m, "satisfiability", js, slow, True)
                base.update(_ratios(base))
                m.fast_fail = True
                st["baseline"] = base
                st["speedup_fail_orelse_reserve_1pod_median"] = round(
                    base["fail_orelse_reserve_1pod_16cpu"]["median_ms"]
                    / max(st["fail_orelse_reserve_1pod_16cpu"]["median_ms"], 0.001), 1)
                st["speedup_fail_orelse_reserve_10pod_median"] = round(
                    base["fail_orelse_reserve_10pod_16cpu"]["median_ms"]
                    / max(st["fail_orelse_reserve_10pod_16cpu"]["median_ms"], 0.001), 1)
        states[how] = st
    states["reserve"] = reserve_state(count, min(repeat, 10), compare)
    out["states"] = states
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


RESERVE_SEED = 17
RESERVE_PARAMS = {
    "command": ".venv/bin/python bench/scale_5000.py --reserve-only --nodes N --repeat 10 --compare-baseline",
    "state": "per node one 24-cpu pod (600-7,200 s); min(5,000, 5 x nodes) 1-cpu pods (60-3,600 s), "
             "lonode, one matcher job per pod, seed 17",
    "request": "allocate_orelse_reserve of 1 and of 10 pods of 16 cpu, 64Mi, 600 s (RESERVED)",
    "baseline": "same matcher, Matcher.fast_fail = False, one call per request, answers compared",
}


def reserve_state(count: int, repeat: int, compare: bool) -> dict[str, Any]:
    """A backlog whose head gets a reservation (issue 17 item 3): every node runs one 24-cpu
    pod and the cluster 5,000 1-cpu pods more (lonode packs them node by node), all of known
    durations (random, seeded: 600-7,200 s and 60-3,600 s), one matcher job per pod. A 16-cpu
    pod (600 s) fits nowhere now; the root has room at every end time, a node only once
    enough of its pods ended: `allocate_orelse_reserve` answers RESERVED. Each answer is
    cancelled again (the state stays). With ``compare``: the same questions with
    ``Matcher.fast_fail = False`` (a walk at every candidate start time) on the same matcher,
    and the answers must be equal."""
    import random
    from dataclasses import replace

    from fluxnetes.graph.topology import from_k8s_nodes_topology
    from fluxnetes.jobspec import PodRequest, jobspec_from_pods
    from fluxnetes.match.matcher import Matcher

    graph, _ = from_k8s_nodes_topology(node_objects(count), {}, rack_label="fluxnetes.io/rack")
    m = Matcher(graph, policy="lonode")
    rng = random.Random(RESERVE_SEED)
    t0 = time.perf_counter()
    base = jobspec_from_pods(1, PodRequest(24_000, POD_MEMORY), name="base")
    small = jobspec_from_pods(1, PodRequest(POD_CPU_MILLIS, POD_MEMORY), name="small")
    for _ in range(count):
        if not m.allocate(replace(base, duration=rng.randint(600, 7200)), now=0).ok:
            raise SystemExit("reserve fill: 24-cpu pod did not fit")
    smalls = min(5000, count * 5)  # (below 1,000 nodes: 5 per node)
    for _ in range(smalls):
        if not m.allocate(replace(small, duration=rng.randint(60, 3600)), now=0).ok:
            raise SystemExit("reserve fill: 1-cpu pod did not fit")
    st: dict[str, Any] = {"fill_s": round(time.perf_counter() - t0, 2), "running_pods": count + smalls,
                          "what": "every node one 24-cpu pod (600-7,200 s) + 5,000 1-cpu pods (60-3,600 s); "
                                  "request: 16 cpu, 64Mi, 600 s (1 pod, and a group of 10)"}
    reqs = {label: replace(jobspec_from_pods(n, PodRequest(16_000, POD_MEMORY), name=label), duration=600)
            for label, n in (("1pod_16cpu", 1), ("10pod_16cpu", 10))}
    answers: dict[str, Any] = {}
    for label, js in reqs.items():
        st[f"reserve_{label}"] = measure(m, "allocate_orelse_reserve", js, repeat, True)
        r = m.allocate_orelse_reserve(js, now=0)
        answers[label] = (r.status.value, r.at, [(v.path, v.size) for v in r.vertices])
        st[f"reserve_{label}"]["at"] = r.at
        m.cancel(r.jobid)
    if compare:
        m.fast_fail = False
        base_st: dict[str, Any] = {"what": "the same matcher and state, Matcher.fast_fail = False (a full walk "
                                           "at every candidate start time, as before this work); one call per "
                                           "request (each costs seconds), its answer compared with the "
                                           "optimised one"}
        for label, js in reqs.items():
            ms, cpu, r = timed(lambda js=js: m.allocate_orelse_reserve(js, now=0))
            got = (r.status.value, r.at, [(v.path, v.size) for v in r.vertices])
            m.cancel(r.jobid)
            if got != answers[label]:
                raise SystemExit(f"reserve {label}: baseline answer differs from the optimised one")
            base_st[f"reserve_{label}"] = {"op": "allocate_orelse_reserve", "status": r.status.value, "calls": 1,
                                           "wall_ms": round(ms, 3), "cpu_ms": round(cpu, 3), "at": r.at}
        m.fast_fail = True
        st["baseline"] = base_st
        st["answers_equal"] = True
        for label in reqs:
            st[f"speedup_reserve_{label}_cpu"] = round(
                base_st[f"reserve_{label}"]["cpu_ms"] / max(st[f"reserve_{label}"]["median_cpu_ms"], 0.001), 1)
    return st


def _ratios(st: dict[str, Any]) -> dict[str, float]:
    """Failing over successful (median wall ms; "_cpu": this process's CPU ms)."""
    ok1, ok10 = st["allocate_1pod"], st["allocate_10pod"]
    f1, f10 = st["fail_orelse_reserve_1pod_16cpu"], st["fail_orelse_reserve_10pod_16cpu"]
    return {
        "ratio_fail_orelse_reserve_1pod_over_ok_1pod_cpu": round(
            f1["median_cpu_ms"] / max(ok1["median_cpu_ms"], 0.001), 2),
        "ratio_fail_allocate_1pod_over_ok_1pod": round(
            st["fail_allocate_1pod_16cpu"]["median_ms"] / max(ok1["median_ms"], 0.001), 2),
        "ratio_fail_orelse_reserve_1pod_over_ok_1pod": round(f1["median_ms"] / max(ok1["median_ms"], 0.001), 2),
        "ratio_fail_orelse_reserve_10pod_over_ok_10pod": round(
            f10["median_ms"] / max(ok10["median_ms"], 0.001), 2),
    }


def _proc_ticks(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _status_field(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _timed_cmd(argv: list[str], timeout: float = 900) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return round(time.monotonic() - t0, 2), res


def cluster_run(count: int, idle_seconds: float) -> dict[str, Any]:
    import tempfile

    from fluxnetes.devcluster import Cluster

    cli = str(Path(sys.executable).with_name("fluxnetes"))
    out: dict[str, Any] = {"nodes": count, "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="fx-scale-") as tmp:
        d = Path(tmp) / "cluster"
        up_s, res = _timed_cmd([cli, "dev", "cluster", "up", "--nodes", str(count), "--dir", str(d)], 1800)
        out["up_s"] = up_s
        out["up_output"] = (res.stdout.strip().splitlines() or [""])[0]
        if res.returncode != 0:
            out["up_error"] = res.stderr[-3000:]
            _timed_cmd([cli, "dev", "cluster", "down", "--dir", str(d)])
            return out
        try:
            cluster = Cluster.attach(d)
            pids = cluster.pids
            out["load_avg_after_up"] = [round(x, 2) for x in os.getloadavg()]
            out["rss_mb"] = {n: _status_field(p, "VmRSS") for n, p in pids.items()}
            out["peak_rss_mb"] = {n: _status_field(p, "VmHWM") for n, p in pids.items()}
            time.sleep(5)  # let the last node updates settle
            tick = os.sysconf("SC_CLK_TCK")
            before = {n: _proc_ticks(p) for n, p in pids.items()}
            time.sleep(idle_seconds)
            out["idle_cpu_cores"] = {n: round((_proc_ticks(p) - before[n]) / tick / idle_seconds, 3)
                                     for n, p in pids.items()}
            out["idle_seconds"] = idle_seconds
            out["load_avg_idle"] = [round(x, 2) for x in os.getloadavg()]
            kubectl = [str(cluster.tools.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}"]
            gets = []
            for _ in range(3):
                secs, r = _timed_cmd([*kubectl, "get", "nodes", "--no-headers"], 300)
                gets.append(secs)
                out["kubectl_get_nodes_lines"] = len(r.stdout.splitlines())
            out["kubectl_get_nodes_s"] = gets
            small = []
            for _ in range(5):
                t0 = time.monotonic()
                cluster.api_get("/api/v1/nodes?limit=1")
                small.append(round((time.monotonic() - t0) * 1000, 1))
            out["list_one_node_ms"] = small
            data = Path(cluster.state.data_dir)
            out["etcd_data_mb"] = round(sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 2**20, 1)
        finally:
            down_s, res = _timed_cmd([cli, "dev", "cluster", "down", "--dir", str(d)])
            out["down_s"] = down_s
            out["down_output"] = res.stdout.strip()
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def sample_operator(bench_pid: int, interval: float = 2.0) -> dict[str, Any]:
    """While `bench_pid` (an operator_bench run) lives, sample the RSS and CPU of its
    descendants that run the operator (`-m fluxnetes.k8s`): peak RSS and CPU seconds each."""
    import psutil

    seen: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    try:
        parent = psutil.Process(bench_pid)
        while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
            for child in parent.children(recursive=True):
                try:
                    cmd = child.cmdline()
                    if "fluxnetes.k8s" not in cmd:
                        continue
                    rss = child.memory_info().rss / 2**20
                    cpu = sum(child.cpu_times()[:2])
                except psutil.Error:
                    continue
                rec = seen.setdefault(child.pid, {"argv_tail": " ".join(cmd[-4:]),
                                                  "first_seen_s": round(time.monotonic() - t0, 1),
                                                  "peak_rss_mb": 0.0})
                rec["peak_rss_mb"] = round(max(rec["peak_rss_mb"], rss), 1)
                rec["last_rss_mb"] = round(rss, 1)
                rec["cpu_s"] = round(cpu, 1)
                rec["last_seen_s"] = round(time.monotonic() - t0, 1)
            time.sleep(interval)
    except psutil.NoSuchProcess:
        pass
    return {"bench_pid": bench_pid, "interval_s": interval, "operators": list(seen.values())}


def measure_in_child(args: argparse.Namespace, count: int, *extra: str) -> dict[str, Any] | int:
    """One node count measured in a fresh subprocess (so RSS is per size): its JSON with the
    wall time and the load around it, or the child's exit status if it failed."""
    t0 = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    argv = [sys.executable, __file__, "--one", str(count), "--repeat", str(args.repeat), *extra]
    if args.compare_baseline:
        argv.append("--compare-baseline")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    out: dict[str, Any] = json.loads(proc.stdout)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["load_avg_before"] = load_before
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def reserve_main(args: argparse.Namespace) -> int:
    """Run the 'reserve' state per node count (a subprocess each) and store it under
    results[i]["states"]["reserve"] of the existing file, keeping everything else."""
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results = doc.setdefault("results", [])
    for count in args.nodes:
        st = measure_in_child(args, count, "--reserve-only")
        if isinstance(st, int):
            return st
        st["repeat"] = args.repeat
        st["python"] = platform.python_version()
        st["cpu_count"] = os.cpu_count()
        print(json.dumps(st, indent=1), flush=True)
        row = next((r for r in results if r.get("nodes") == count), None)
        if row is None:
            row = {"nodes": count}
            results.append(row)
        row.setdefault("states", {})["reserve"] = st
    doc.setdefault("parameters", {})["reserve_state"] = RESERVE_PARAMS
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--cluster-nodes", type=int, help="run `fluxnetes dev cluster up` with this many nodes")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--sample-operator", type=int, metavar="PID",
                    help="sample the operator processes of this operator_bench run (RSS, CPU) until it ends")
    ap.add_argument("--compare-baseline", action="store_true",
                    help="also measure the failing questions with Matcher.fast_fail = False (before/after)")
    ap.add_argument("--reserve-only", action="store_true",
                    help="only the 'reserve' state (a reservation found), merged into the results file")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child: one size, JSON to stdout
    args = ap.parse_args()
    if args.one:
        if args.reserve_only:
            print(json.dumps(reserve_state(args.one, args.repeat, args.compare_baseline)))
        else:
            print(json.dumps(one_size(args.one, args.repeat, args.compare_baseline)))
        return 0
    if args.reserve_only:
        return reserve_main(args)
    if args.sample_operator:
        sampled = sample_operator(args.sample_operator)
        kept: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
        kept["operator_bench_processes"] = sampled
        args.out.write_text(json.dumps(kept, indent=2) + "\n")
        print(json.dumps(sampled, indent=1))
        return 0
    if args.cluster_nodes:
        doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
        run = cluster_run(args.cluster_nodes, args.idle_seconds)
        print(json.dumps(run, indent=1), flush=True)
        doc["dev_cluster"] = run
        doc.setdefault("machine", {})["cpu_count"] = os.cpu_count()
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
        return 0 if "up_error" not in run else 1
    load_start = os.getloadavg()
    results = []
    for count in args.nodes:
        r = measure_in_child(args, count)
        if isinstance(r, int):
            return r
        results.append(r)
        print(json.dumps(r, indent=1), flush=True)
    # keep what other modes (--cluster-nodes, --sample-operator) recorded in the same file
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
    doc.update({
        "benchmark": "scale_5000",
        "parameters": {
            "nodes": args.nodes,
            "repeat": args.repeat,
            "compare_baseline": args.compare_baseline,
            "baseline_fail_repeat": BASELINE_FAIL_REPEAT if args.compare_baseline else None,
            "node_shape": "dev cluster default: 32 cpu, 256Gi, 110 pods, 1 zone, 1 rack",
            "pod": "1 cpu, 64Mi (operator_bench's Jobs); failing pod: 16 cpu, 64Mi",
            "policy": "lonode (operator default)",
            "graph_path": "graph.topology.from_k8s_nodes_topology (k8s/topology.build_graph), Matcher",
        },
        "results": results,
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "note": "the machine is shared (2 cores, other sessions' work ran meanwhile): load_avg_* "
                "say how busy it was; *_cpu_ms are this process's CPU time, less affected by it",
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
