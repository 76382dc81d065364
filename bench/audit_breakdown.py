"""Who asks the API server for what, per pod, from its audit log: the requests of each run of
bench/operator_bench.py (or apiserver_profile.py) split by client (user agent), verb and
resource, with their mean latency, and the path of each Job (created -> its pod created ->
bound) as the API server saw it.

Run the benchmark with ``FLUXNETES_DEV_AUDIT=DIR`` (the dev cluster's API server then writes
DIR/audit.log, Metadata level, Leases left out; each run's result names its namespace), then:

    .venv/bin/python bench/audit_breakdown.py BENCH_STDOUT DIR/audit.log [--output OUT.json]

(BENCH_STDOUT: what operator_bench.py printed, its one line per run.)

Requests in the run's namespace are the workload's; requests elsewhere during the run (from
its namespace's first to its last request) are counted apart (``outside_namespace``): the
operator's FluxJob and Event writes land in the workload's namespace, its cluster-wide
watches and lists and the nodes' heartbeats do not. The benchmark's own client and the
operator both say ``aiohttp``: the benchmark only creates the Jobs, watches the namespace's
Pods and Jobs and reads /metrics.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any


def client(ua: str) -> str:
    """A short client name from a user agent: the controller for kube-controller-manager."""
    if ua.startswith("kube-controller-manager/"):
        return "kcm/" + (ua.rsplit("/", 1)[-1] if ua.count("/") > 3 else "?")
    for name in ("kube-scheduler", "kube-apiserver", "kwok", "kubectl"):
        if ua.startswith(name + "/"):
            return name
    if "aiohttp" in ua:
        return "aiohttp (operator; bench: Jobs, its watches)"
    return ua.split("/")[0] or "?"


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def request(e: dict[str, Any]) -> str:
    ref = e.get("objectRef") or {}
    res = ref.get("resource") or e.get("requestURI", "?").split("?")[0]
    sub = ref.get("subresource")
    return f"{e['verb']} {res}{'/' + sub if sub else ''}"


def _pcts(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    return {"n": len(xs), "p50_ms": round(1000 * statistics.median(xs), 1),
            "p90_ms": round(1000 * xs[int(0.9 * (len(xs) - 1))], 1), "max_ms": round(1000 * xs[-1], 1)}


def runs_of(printed: str) -> list[tuple[str, str, int, dict[str, Any]]]:
    """(workload, label, round, run) for every run operator_bench.py printed (its stdout: one
    line ``LABEL WORKLOAD {run}`` per run, in order; each run names its namespace)."""
    out = []
    seen: Counter[tuple[str, str]] = Counter()
    for line in printed.splitlines():
        m = re.match(r"(default_scheduler|fluxnetes\S*) (\w+) (\{.*\})$", line)
        if m is None:
            continue
        try:
            r = ast.literal_eval(m.group(3))
        except (ValueError, SyntaxError):
            continue
        if isinstance(r, dict) and r.get("namespace"):
            label, workload = m.group(1), m.group(2)
            out.append((workload, label, seen[(workload, label)], r))
            seen[(workload, label)] += 1
    return out


def breakdown(events: list[dict[str, Any]], ns: str, pods: int) -> dict[str, Any]:
    inside = [e for e in events if (e.get("objectRef") or {}).get("namespace") == ns]
    if not inside:
        return {"namespace": ns, "requests": 0}
    t0 = min(_ts(e["requestReceivedTimestamp"]) for e in inside)
    # the run ends at its last pod's binding (the namespace's deletion follows)
    binds = [_ts(e["stageTimestamp"]) for e in inside if request(e) in ("create pods/binding", "patch pods")]
    t1 = max(binds) if binds else max(_ts(e["stageTimestamp"]) for e in inside)
    window = [e for e in inside if _ts(e["requestReceivedTimestamp"]) <= t1 and e["verb"] != "watch"]
    by: Counter[tuple[str, str]] = Counter()
    lat: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in window:
        key = (client(e.get("userAgent", "")), request(e))
        by[key] += 1
        lat[key].append(_ts(e["stageTimestamp"]) - _ts(e["requestReceivedTimestamp"]))
    outside: Counter[tuple[str, str]] = Counter()
    for e in events:
        ref = e.get("objectRef") or {}
        if ref.get("namespace") == ns or e["verb"] == "watch" or ref.get("resource") == "leases":
            continue
        t = _ts(e["requestReceivedTimestamp"])
        if t0 <= t <= t1:
            outside[(client(e.get("userAgent", "")), request(e))] += 1
    # the path of each Job: its create answered, its pod's create answered, its binding answered
    job_created: dict[str, float] = {}
    pod_created: dict[str, float] = {}
    pod_bound: dict[str, float] = {}
    for e in window:
        ref, r = e.get("objectRef") or {}, request(e)
        name = ref.get("name") or ""
        code = (e.get("responseStatus") or {}).get("code", 0)
        if code >= 300:
            continue
        if r == "create jobs" and name:
            job_created[name] = _ts(e["stageTimestamp"])
        elif r == "create pods" and name:
            pod_created[name] = _ts(e["stageTimestamp"])
        elif r == "create pods/binding" and name:
            pod_bound.setdefault(name, _ts(e["stageTimestamp"]))
        elif r == "patch pods" and name and "scheduler" in client(e.get("userAgent", "")):
            pod_bound.setdefault(name, _ts(e["stageTimestamp"]))  # (a status patch: not a bind)
    # (a pod made from generateName has no name in its create's audit event: its Binding has)
    job_of = {p: m.group(1) for p in {*pod_created, *pod_bound} if (m := re.match(r"(.+)-[a-z0-9]{5}$", p))}
    to_pod = [pod_created[p] - job_created[j] for p, j in job_of.items() if j in job_created and p in pod_created]
    to_bound = [pod_bound[p] - pod_created[p] for p in pod_created if p in pod_bound]
    whole = [pod_bound[p] - job_created[j] for p, j in job_of.items() if p in pod_bound and j in job_created]
    return {
        "namespace": ns,
        "seconds": round(t1 - t0, 2),
        "requests_per_pod": {f"{c} | {r}": round(n / pods, 3) for (c, r), n in by.most_common() if n / pods >= 0.01},
        "mean_latency_ms": {f"{c} | {r}": round(1000 * statistics.mean(v), 1) for (c, r), v in
                            sorted(lat.items(), key=lambda kv: -len(kv[1])) if len(v) / pods >= 0.1},
        "outside_namespace_per_pod": {f"{c} | {r}": round(n / pods, 3) for (c, r), n in outside.most_common()
                                      if n / pods >= 0.01},
        "by_client_per_pod": {c: round(n / pods, 2) for c, n in
                              Counter({c: sum(n for (cc, _), n in by.items() if cc == c) for c, _ in by}).most_common()},
        "timeline": {"job_created_to_pod_created": _pcts(to_pod), "pod_created_to_bound": _pcts(to_bound),
                     "job_created_to_bound": _pcts(whole),
                     "span_s": round(max(pod_bound.values()) - min(job_created.values()), 2)
                     if pod_bound and job_created else None},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("printed", help="operator_bench.py's (or apiserver_profile.py's) printed output")
    ap.add_argument("audit_log")
    ap.add_argument("--output", help="write the breakdown here (default: print)")
    args = ap.parse_args()
    printed = Path(args.printed).read_text()
    events = []
    with open(args.audit_log) as fh:
        for line in fh:
            e = json.loads(line)
            if e.get("stage") in ("ResponseComplete", "ResponseStarted"):
                events.append(e)
    out: dict[str, Any] = {"benchmark": "audit_breakdown", "source": args.printed, "runs": {}}
    for workload, label, rnd, r in runs_of(printed):
        pods = r.get("pods") or 1
        out["runs"][f"{workload} {label} r{rnd}"] = breakdown(events, r["namespace"], pods)
    text = json.dumps(out, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
