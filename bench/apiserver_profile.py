"""Where the API server's CPU goes for single-pod Jobs: fluxnetes against kube-scheduler.

Runs bench/operator_bench.py (the same cluster, workloads and alternating rounds) with the API
server's profiler on, its CPU profile taken in consecutive windows over each whole run, and
breaks each run's samples down by request kind (watch, list, get, create, patch, update,
delete; FluxJob custom-resource requests apart) and, within it, by the work done (JSON or
protobuf encoding, patch application, admission, managed fields, storage, TLS, ...). With
the counts of requests and of watch events (and bytes) per pod from the API server's metrics.
Each run's profiled CPU per pod is also given with the API server's idle rate (operator_bench's
idle windows) times the profiled seconds taken off: ``cpu_ms_per_pod_corrected``.

    FLUXNETES_DEV_PROFILING=1 .venv/bin/python bench/apiserver_profile.py --nodes 1000 --jobs 1000

Writes bench/results/apiserver_profile.json (--output). Extra arguments after ``--`` go to
operator_bench.py (e.g. ``-- --variant-src before=DIR --variant-src after=src --rounds 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_bench

RESULTS = Path(__file__).resolve().parent / "results" / "apiserver_profile.json"

# a sample's request kind: the first rule (in this order) one of its frames matches
REQUEST_KINDS: list[tuple[str, str]] = [
    ("gc (background mark)", "runtime.gcBgMarkWorker"),
    ("custom resources (FluxJob)", "apiextensions-apiserver/pkg/"),
    ("watch", r"handlers\.serveWatch|\(\*WatchServer\)|handlers\.\(\*watchEncoder\)|handleWatch"),
    ("list", r"handlers\.ListResource"),
    ("get", r"handlers\.GetResource|getResourceHandler"),
    ("create", r"handlers\.(createHandler|CreateResource|CreateNamedResource)"),
    ("patch", r"handlers\.PatchResource|handlers\.\(\*patcher\)"),
    ("update", r"handlers\.UpdateResource"),
    ("delete", r"handlers\.(DeleteResource|DeleteCollection)"),
    ("watch cache (dispatch to watchers)", r"storage/cacher\."),
    ("etcd client / watch from etcd", r"storage/etcd3|go\.etcd\.io/etcd/client|google\.golang\.org/grpc"),
    ("TLS handshake", r"crypto/tls\.\(\*Conn\)\.(serverHandshake|clientHandshake|Handshake)"),
    ("audit log (FLUXNETES_DEV_AUDIT runs only)", r"k8s\.io/apiserver/pkg/audit|plugin/pkg/audit"),
    ("request filters (audit, flow control, authn, timeouts)", r"DefaultBuildHandlerChain"),
    ("http serving (TLS records, h2 frames)", r"net/http|golang\.org/x/net/http2|crypto/tls"),
    ("controllers inside the API server", r"k8s\.io/client-go/tools/cache|k8s\.io/kubernetes/pkg/controlplane"),
]

# the work a sample does: the first rule matched going from the leaf up its stack
WORK_KINDS: list[tuple[str, str]] = [
    ("json encode", r"serializer/json\.\(\*Serializer\)\.(Encode|doEncode)|encoding/json\.(Marshal|\(\*encodeState\)|\(\*Encoder\))|json-iterator.*(Write|Encode|Marshal)"),
    ("json decode", r"serializer/json\.\(\*Serializer\)\.Decode|sigs\.k8s\.io/json|encoding/json\.(Unmarshal|\(\*decodeState\))|json-iterator.*(Read|Decode|Unmarshal)|UnstructuredJSONScheme\)\.Decode"),
    ("protobuf encode", r"serializer/protobuf\.\(\*Serializer\)\.(Encode|doEncode)|\.MarshalToSizedBuffer|\)\.Marshal$|\)\.Size$"),
    ("protobuf decode", r"serializer/protobuf\.\(\*Serializer\)\.Decode|\)\.Unmarshal$"),
    ("strategic merge patch", r"strategicpatch\."),
    ("json / merge patch", r"evanphx/json-patch|jsonpatch\."),
    ("managed fields", r"structured-merge-diff|fieldmanager\."),
    ("admission webhook call", r"admission/plugin/webhook"),
    ("admission (built-in)", r"k8s\.io/apiserver/pkg/admission|k8s\.io/kubernetes/plugin/pkg/admission"),
    ("validation / defaulting", r"validation\.Validate|ValidateObject|SetDefaults|SetObjectDefaults|"
     r"structuraldefaulting|schemaobjectmeta|apiextensions-apiserver/pkg/apiserver/validation|kube-openapi"),
    ("authn / authz", r"authentication/request/x509|bearertoken|authenticatorfactory|RBACAuthorizer|"
     r"NodeAuthorizer|rbac\.\(|authorizerfactory"),
    ("conversion", r"conversion\.|\.Convert_"),
    ("deep copy", r"DeepCopy"),
    ("TLS crypto", r"crypto/"),
    ("etcd / grpc", r"etcd|grpc"),
    ("syscalls", r"syscall\.|internal/runtime/syscall"),
]


# the resource a sample works on, where its stack shows it (the resource's own storage or
# strategy code: not every sample passes through it, so these are lower bounds)
RESOURCES: list[tuple[str, str]] = [
    ("leases", r"registry/coordination/lease"),
    ("nodes", r"registry/core/node"),
    ("pods", r"registry/core/pod"),
    ("events", r"registry/core/event"),
    ("jobs", r"registry/batch/job"),
    ("namespaces", r"registry/core/namespace"),
    ("custom resources (FluxJob)", r"apiextensions-apiserver/pkg/"),
]


def traces(files: list[str]) -> Iterator[tuple[float, list[str]]]:
    """(CPU seconds, stack leaf first) per distinct stack of the merged profiles."""
    out = subprocess.run(["go", "tool", "pprof", "-traces", *files], capture_output=True, text=True,
                         check=True).stdout
    for block in out.split("-----------+-------------------------------------------------------")[1:]:
        lines = [ln.strip() for ln in block.strip("\n").splitlines() if ln.strip()]
        m = re.match(r"([\d.]+)(ms|s|us|µs)\s+(.*)", lines[0]) if lines else None
        if m is None:
            continue
        unit = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}[m.group(2)]
        yield float(m.group(1)) * unit, [m.group(3), *lines[1:]]


def request_kind(stack: list[str]) -> str:
    for name, pattern in REQUEST_KINDS:
        rx = re.compile(pattern)
        if any(rx.search(f) for f in stack):
            return name
    return "other"


def work_kind(stack: list[str]) -> str:
    rules = [(name, re.compile(p)) for name, p in WORK_KINDS]
    for frame in stack:
        for name, rx in rules:
            if rx.search(frame):
                return name
    return "other (allocation, maps, scheduling)"


def resource(stack: list[str]) -> str:
    for name, pattern in RESOURCES:
        rx = re.compile(pattern)
        if any(rx.search(f) for f in stack):
            return name
    return "not shown"


def breakdown(files: list[str]) -> dict[str, Any]:
    """CPU seconds by request kind, each split by work kind (shares of the run's total), and
    by resource where the stack shows it."""
    total = 0.0
    by_req: Counter[str] = Counter()
    by_work: dict[str, Counter[str]] = {}
    by_res: dict[str, Counter[str]] = {}
    for v, stack in traces(files):
        total += v
        req = request_kind(stack)
        by_req[req] += v
        by_work.setdefault(req, Counter())[work_kind(stack)] += v
        by_res.setdefault(resource(stack), Counter())[req] += v
    out: dict[str, Any] = {"total_cpu_s": round(total, 2), "by_request_kind": {}}
    for req, v in by_req.most_common():
        out["by_request_kind"][req] = {
            "cpu_s": round(v, 2), "share": round(v / total, 3) if total else 0.0,
            "work": {w: round(x, 2) for w, x in by_work[req].most_common() if x >= 0.05},
        }
    enc: Counter[str] = Counter()
    for req, works in by_work.items():
        for w, x in works.items():
            if w.startswith(("json", "protobuf")):
                enc[f"{req}: {w}"] += x
    out["serialization"] = {k: round(v, 2) for k, v in enc.most_common() if v >= 0.05}
    out["by_resource_where_shown"] = {
        res: {"cpu_s": round(sum(c.values()), 2), **{k: round(x, 2) for k, x in c.most_common() if x >= 0.05}}
        for res, c in sorted(by_res.items(), key=lambda kv: -sum(kv[1].values()))}
    return out


def analyse(out: dict[str, Any], files_of: dict[tuple[str, str], list[str]]) -> None:
    """Put each run's breakdown (from its profile files) into operator_bench's results."""
    for workload, runs in out["workloads"].items():
        for label, r in list(runs.items()):
            files = files_of.get((workload, label))
            if isinstance(r, dict) and files:
                r["apiserver_profile"] = prof = breakdown(files)
                prof["cpu_ms_per_pod"] = round(1000 * prof["total_cpu_s"] / r["pods"], 2)
                window = out["parameters"].get("profile_window_s")
                rate = (r.get("idle_cpu_rates") or {}).get("kube-apiserver")
                if window and rate is not None:
                    # the windows profiled (the last one runs past the run's end) at the API
                    # server's idle rate: the background the profile holds, taken off
                    prof["profiled_s"] = len(files) * window
                    prof["cpu_ms_per_pod_corrected"] = round(
                        1000 * (prof["total_cpu_s"] - rate * prof["profiled_s"]) / r["pods"], 2)
                print(workload, label, json.dumps(prof, indent=1), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1000, help="single-pod Jobs")
    ap.add_argument("--gang-jobs", type=int, default=0)
    ap.add_argument("--window", type=int, default=30, help="seconds per profile window")
    ap.add_argument("--output", default=str(RESULTS))
    ap.add_argument("--keep-pprof", metavar="DIR", help="keep the profile files here")
    ap.add_argument("--reanalyse", nargs=2, metavar=("RESULT", "DIR"), help="no run: redo the breakdown of "
                    "RESULT (this script's JSON) from the profiles kept in DIR (--keep-pprof)")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then operator_bench.py arguments")
    args = ap.parse_args()
    rest = [a for a in args.rest if a != "--"]
    if args.reanalyse:
        result, kept = args.reanalyse
        out = json.loads(Path(result).read_text())
        files_of: dict[tuple[str, str], list[str]] = {}
        for f in sorted(Path(kept).glob("apiserver-*.pprof"), key=lambda p: int(p.stem.rsplit("-w", 1)[1])):
            label, workload = re.match(r"apiserver-(.+)-(single_pod_jobs|gang_jobs_of_10)-r\d+-w\d+", f.stem).groups()
            files_of.setdefault((workload, label), []).append(str(f))
        analyse(out, files_of)
        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="fx-apiprof-") as tmp:
        raw = Path(tmp) / "operator_bench.json"
        sys.argv = ["operator_bench.py", "--nodes", str(args.nodes), "--jobs", str(args.jobs),
                    "--gang-jobs", str(args.gang_jobs), "--webhook-requests", "0", "--pprof", str(Path(tmp) / "pprof"),
                    "--pprof-seconds", str(args.window), "--output", str(raw), *rest]
        os.environ["FLUXNETES_DEV_PROFILING"] = "1"
        operator_bench.main()
        out: dict[str, Any] = json.loads(raw.read_text())
        out["benchmark"] = "apiserver_profile"
        out["parameters"]["profile_window_s"] = args.window
        out["parameters"]["command"] = " ".join(["bench/apiserver_profile.py", *sys.argv[1:]])
        out["classification"] = {"request_kinds": REQUEST_KINDS, "work_kinds": WORK_KINDS,
                                 "note": "a sample's request kind is the first rule any frame of its stack "
                                         "matches; its work kind the first rule met going up from the leaf"}
        files_of = {(w, label): r.pop("pprof_files") for w, runs in out["workloads"].items()
                    for label, r in runs.items() if isinstance(r, dict) and r.get("pprof_files")}
        if args.keep_pprof:
            Path(args.keep_pprof).mkdir(parents=True, exist_ok=True)
            for key, files in files_of.items():
                files_of[key] = [shutil.copy(f, args.keep_pprof) for f in files]
        analyse(out, files_of)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
