"""What protobuf watch streams would save the operator per pod, against today's JSON.

Issue #31's lead: kube-scheduler and the controllers watch in protobuf, the operator's watches
(``Kube.watch``: ``Accept: application/json``, one ``orjson.loads`` per line) in JSON. This
benchmark measures both encodings on the same events, without changing the operator:

1. **capture** (``--dir`` of a running dev cluster): watch Pods and Jobs of a fresh namespace
   twice at once, from the same resourceVersion — ``Accept: application/json`` (the operator's
   request) and ``Accept: application/vnd.kubernetes.protobuf;stream=watch`` — while ``--jobs``
   single-pod Jobs are created and kwok runs them to completion; the four raw streams are saved
   in ``--work`` (``pods.json``, ``pods.pb``, ``jobs.json``, ``jobs.pb``).
2. **measure**: per event, bytes on the wire; decode µs (``orjson.loads`` of a line against
   parsing a frame: a ``meta.v1.WatchEvent`` whose object is ``k8s\\0`` + ``runtime.Unknown``
   holding the Pod or Job); µs to reach the fields the operator reads (metadata name /
   namespace / uid / labels / annotations / ownerReferences, the spec's nodeName /
   schedulerName / container requests / schedulingGates, status phase / conditions) from the
   dict and from the message; and ``MessageToDict`` (what it would cost to keep the operator's
   dict code). Rounds alternate the two encodings; figures are the rounds' medians.
3. **tls** (``--tls``): each saved stream served by a local aiohttp TLS server (a child
   process) and read by an aiohttp client as ``Kube.watch`` reads it (``iter_any``, split into
   events): the reader's CPU µs per event, per encoding, with the server writing 16 KB pieces
   back to back (burst) and one event per write 1 ms apart (trickle, as a live watch) — the
   read the operator's profile puts at 1.9 ms per pod with its requests.

All timings are this process's CPU time (``time.process_time``), not wall time: the machine
is shared.

The protobuf classes are generated at run time from the pinned k8s.io/api and apimachinery
v0.36.3 ``generated.proto`` files in the Go module cache (``--protos``) with grpcio-tools'
protoc, into ``--work``/pb (never into src/). **Needs** ``pip install grpcio-tools protobuf``
(benchmark only; not runtime dependencies of fluxnetes).

    .venv/bin/python bench/watch_encoding.py --dir /tmp/dev --jobs 100 --work /tmp/we \\
        --output bench/results/watch_encoding.json
    .venv/bin/python bench/watch_encoding.py --work /tmp/we --no-capture ...   # re-measure

Per-pod projection: the event counts per pod the operator's watches add (``--pod-events``,
``--job-events``: 4.6 and 2.3, docs/scale.md's single-pod section) x the per-event differences.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import ssl
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

K8S_VERSION = "v0.36.3"
PROTO_FILES = [
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/api/batch/v1/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
    "k8s.io/apimachinery/pkg/runtime/generated.proto",
    "k8s.io/apimachinery/pkg/runtime/schema/generated.proto",
    "k8s.io/apimachinery/pkg/util/intstr/generated.proto",
    "k8s.io/apimachinery/pkg/api/resource/generated.proto",
]
JSON_ACCEPT = "application/json"
PB_ACCEPT = "application/vnd.kubernetes.protobuf;stream=watch"
MAGIC = b"k8s\x00"  # the protobuf serializer's prefix before a runtime.Unknown


# --- framing -----------------------------------------------------------------------------------

class FrameError(ValueError):
    """A protobuf watch stream that is not length-prefixed frames."""


def split_frames(buf: bytes) -> tuple[list[bytes], bytes]:
    """Split a protobuf watch stream into its frames: each a 4-byte big-endian length, then that
    many bytes. Returns the whole frames and the incomplete rest (to prepend to the next chunk)."""
    frames = []
    pos, end = 0, len(buf)
    while end - pos >= 4:
        (size,) = struct.unpack_from(">I", buf, pos)
        if end - pos - 4 < size:
            break
        frames.append(buf[pos + 4:pos + 4 + size])
        pos += 4 + size
    return frames, buf[pos:]


def split_lines(buf: bytes) -> tuple[list[bytes], bytes]:
    """The JSON stream's framing, as ``Kube.watch`` does it: one event per line."""
    *lines, rest = buf.split(b"\n")
    return [line for line in lines if line.strip()], rest


def all_frames(data: bytes) -> list[bytes]:
    frames, rest = split_frames(data)
    if rest:
        raise FrameError(f"protobuf stream: {len(rest)} bytes after the last whole frame")
    return frames


# --- protobuf classes --------------------------------------------------------------------------

def compile_protos(protos: Path, out: Path) -> None:
    """Generate the Python classes into ``out`` (import paths k8s.io/... map to k8s/io/...)."""
    inc = out / "inc" / "k8s.io"
    inc.mkdir(parents=True, exist_ok=True)
    for name in ("api", "apimachinery"):
        link, target = inc / name, protos / f"{name}@{K8S_VERSION}"
        if not target.is_dir():
            raise SystemExit(f"--protos: {target} missing (go mod download k8s.io/{name}@{K8S_VERSION})")
        if not link.exists():
            link.symlink_to(target)
    gen = out / "gen"
    gen.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out / 'inc'}", f"--python_out={gen}",
                    *PROTO_FILES], check=True, capture_output=True)
    sys.path.insert(0, str(gen))


class Classes:
    def __init__(self) -> None:
        core = importlib.import_module("k8s.io.api.core.v1.generated_pb2")
        batch = importlib.import_module("k8s.io.api.batch.v1.generated_pb2")
        meta = importlib.import_module("k8s.io.apimachinery.pkg.apis.meta.v1.generated_pb2")
        runtime = importlib.import_module("k8s.io.apimachinery.pkg.runtime.generated_pb2")
        self.WatchEvent = meta.WatchEvent
        self.Unknown = runtime.Unknown
        self.kinds = {"Pod": core.Pod, "Job": batch.Job}


def decode_frame(frame: bytes, classes: Classes) -> tuple[str, Any]:
    """One frame → (event type, the Pod / Job message). The frame is a WatchEvent; its object's
    raw bytes are ``k8s\\0`` + a runtime.Unknown whose raw bytes are the object."""
    event = classes.WatchEvent()
    event.ParseFromString(frame)
    raw = event.object.raw
    if raw[:4] != MAGIC:
        raise FrameError(f"watch event object: starts {raw[:4]!r}, not the protobuf magic {MAGIC!r}")
    unknown = classes.Unknown()
    unknown.ParseFromString(raw[4:])
    cls = classes.kinds.get(unknown.typeMeta.kind)
    if cls is None:  # a BOOKMARK of a kind not decoded here, or an ERROR's Status
        return event.type, unknown
    obj = cls()
    obj.ParseFromString(unknown.raw)
    return event.type, obj


# --- the fields the operator reads -------------------------------------------------------------

def meta_dict(m: dict[str, Any]) -> tuple[Any, ...]:
    labels = m.get("labels") or {}
    annotations = m.get("annotations") or {}
    owners = [(o.get("kind"), o.get("name"), o.get("uid"), o.get("controller"))
              for o in m.get("ownerReferences") or []]
    return (m.get("name"), m.get("namespace"), m.get("uid"), m.get("resourceVersion"),
            labels.get("fluxnetes.io/group"), labels.get("job-name"), annotations.get("fluxnetes.io/nodes"),
            len(labels), len(annotations), owners)


def meta_msg(m: Any) -> tuple[Any, ...]:
    labels, annotations = m.labels, m.annotations
    owners = [(o.kind, o.name, o.uid, o.controller) for o in m.ownerReferences]
    return (m.name, m.namespace, m.uid, m.resourceVersion,
            labels.get("fluxnetes.io/group"), labels.get("job-name"), annotations.get("fluxnetes.io/nodes"),
            len(labels), len(annotations), owners)


def podspec_dict(s: dict[str, Any]) -> tuple[Any, ...]:
    requests = [dict((c.get("resources") or {}).get("requests") or {}) for c in s.get("containers") or []]
    gates = [g.get("name") for g in s.get("schedulingGates") or []]
    return s.get("nodeName"), s.get("schedulerName"), requests, gates


def podspec_msg(s: Any) -> tuple[Any, ...]:
    requests = [{k: q.string for k, q in c.resources.requests.items()} for c in s.containers]
    gates = [g.name for g in s.schedulingGates]
    return s.nodeName, s.schedulerName, requests, gates


def conditions_dict(st: dict[str, Any]) -> list[tuple[Any, Any]]:
    return [(c.get("type"), c.get("status")) for c in st.get("conditions") or []]


def conditions_msg(st: Any) -> list[tuple[Any, Any]]:
    return [(c.type, c.status) for c in st.conditions]


def pod_fields_dict(obj: dict[str, Any]) -> tuple[Any, ...]:
    st = obj.get("status") or {}
    return meta_dict(obj["metadata"]), podspec_dict(obj.get("spec") or {}), st.get("phase"), conditions_dict(st)


def pod_fields_msg(obj: Any) -> tuple[Any, ...]:
    return meta_msg(obj.metadata), podspec_msg(obj.spec), obj.status.phase, conditions_msg(obj.status)


def job_fields_dict(obj: dict[str, Any]) -> tuple[Any, ...]:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    tmpl = spec.get("template") or {}
    return (meta_dict(obj["metadata"]), spec.get("parallelism"), spec.get("completions"), spec.get("suspend"),
            meta_dict(tmpl.get("metadata") or {}), podspec_dict(tmpl.get("spec") or {}),
            st.get("active"), st.get("succeeded"), st.get("failed"), conditions_dict(st))


def job_fields_msg(obj: Any) -> tuple[Any, ...]:
    spec, st = obj.spec, obj.status
    return (meta_msg(obj.metadata), spec.parallelism, spec.completions, spec.suspend,
            meta_msg(spec.template.metadata), podspec_msg(spec.template.spec),
            st.active, st.succeeded, st.failed, conditions_msg(st))


def normal(value: Any) -> Any:
    """For comparing the two readers: an unset proto2 scalar reads as "" / 0 / False where the
    JSON has no key (None); the operator treats both as unset."""
    if isinstance(value, tuple | list):
        return [normal(v) for v in value]
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    return value or None


# --- capture -----------------------------------------------------------------------------------

def job_body(i: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"we-{i:04d}"},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}}


async def capture(kubeconfig: str, jobs: int, work: Path, settle: float) -> dict[str, Any]:
    import aiohttp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from fluxnetes.k8s.kube import NAMESPACES, Kube, Resource

    jobs_res, pods_res = Resource("batch/v1", "jobs"), Resource("v1", "pods")
    kube = await Kube.from_config(kubeconfig)
    ns = f"watch-enc-{int(time.time())}"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    rv = {name: (await kube.list(res, ns))[1] for name, res in (("pods", pods_res), ("jobs", jobs_res))}
    streams: dict[str, bytearray] = {}

    async def watch(name: str, res: Resource, accept: str, key: str) -> None:
        buf = streams.setdefault(key, bytearray())
        url = (kube.host + res.path(ns) + f"?watch=true&resourceVersion={rv[name]}"
               "&allowWatchBookmarks=true&timeoutSeconds=600")
        async with kube.session().get(url, headers={"Accept": accept},
                                      timeout=aiohttp.ClientTimeout(total=None)) as resp:
            if resp.status >= 400:
                raise SystemExit(f"watch {key}: HTTP {resp.status} {await resp.text()}")
            async for chunk in resp.content.iter_any():
                buf.extend(chunk)

    tasks = [asyncio.create_task(watch(name, res, accept, f"{name}.{ext}"))
             for name, res in (("pods", pods_res), ("jobs", jobs_res))
             for accept, ext in ((JSON_ACCEPT, "json"), (PB_ACCEPT, "pb"))]
    started = time.monotonic()
    await asyncio.gather(*(kube.create(jobs_res, job_body(i), ns) for i in range(jobs)))
    while True:  # until every Job has completed (kwok runs the pods at once)
        items, _ = await kube.list(jobs_res, ns)
        done = sum(1 for j in items if (j.get("status") or {}).get("succeeded"))
        if done >= jobs:
            break
        if time.monotonic() - started > 300:
            raise SystemExit(f"capture: only {done} of {jobs} Jobs completed in 300 s")
        await asyncio.sleep(1)
    await asyncio.sleep(settle)  # the trailing status updates (Job Complete, pod conditions)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await kube.request("DELETE", NAMESPACES.path(name=ns))
    await kube.close()
    work.mkdir(parents=True, exist_ok=True)
    for key, data in streams.items():
        (work / key).write_bytes(bytes(data))
    return {"namespace": ns, "jobs": jobs, "seconds": round(time.monotonic() - started, 1),
            "bytes": {key: len(data) for key, data in streams.items()}}


# --- measure -----------------------------------------------------------------------------------

def per_event_us(fn: Callable[[], Any], n_events: int, min_seconds: float = 0.3) -> float:
    """CPU µs per event of ``fn`` (which handles all n_events once), repeated for >= min_seconds
    of this process's CPU time (not wall time: the machine is shared, other work preempts us)."""
    reps, t0 = 0, time.process_time()
    while True:
        fn()
        reps += 1
        elapsed = time.process_time() - t0
        if elapsed >= min_seconds:
            return elapsed / reps / n_events * 1e6


def measure_kind(kind: str, lines: list[bytes], frames: list[bytes], classes: Classes, rounds: int,
                 fields_dict: Callable[[Any], Any], fields_msg: Callable[[Any], Any]) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    json_events = [orjson.loads(line) for line in lines]
    pb_events = [decode_frame(f, classes) for f in frames]
    pb_types = [t for t, _ in pb_events]
    json_types = [e["type"] for e in json_events]
    if pb_types != json_types:
        raise SystemExit(f"{kind}: the two streams differ: {len(json_types)} JSON events "
                         f"({json_types[:5]}...) vs {len(pb_types)} protobuf ({pb_types[:5]}...)")
    objects = [(e["object"], m) for e, (_, m) in zip(json_events, pb_events, strict=True)
               if e["type"] != "BOOKMARK"]
    for d, m in objects:  # the same facts either way (the test of the field readers)
        if normal(fields_dict(d)) != normal(fields_msg(m)):
            raise SystemExit(f"{kind}: fields differ between JSON and protobuf:\n{fields_dict(d)}\n{fields_msg(m)}")
    dicts = [d for d, _ in objects]
    msgs = [m for _, m in objects]
    n, k = len(lines), len(objects)

    def json_all() -> None:
        for line in lines:
            fields_dict(orjson.loads(line)["object"])

    def pb_all() -> None:
        for f in frames:
            fields_msg(decode_frame(f, classes)[1])

    def json_decode() -> None:
        for line in lines:
            orjson.loads(line)

    def pb_decode() -> None:
        for f in frames:
            decode_frame(f, classes)

    def json_fields() -> None:
        for d in dicts:
            fields_dict(d)

    def pb_fields() -> None:  # on messages already read once (upb makes field wrappers on access)
        for m in msgs:
            fields_msg(m)

    def to_dict() -> None:
        for m in msgs:
            MessageToDict(m)

    # every case drops each result before the next (kept in a list, 500 decoded Pods make the
    # garbage collector's passes the larger cost)
    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "json_decode": (json_decode, n), "pb_decode": (pb_decode, n),
        "json_fields": (json_fields, k), "pb_fields": (pb_fields, k),
        "json_decode_and_fields": (json_all, n), "pb_decode_and_fields": (pb_all, n),
        "pb_message_to_dict": (to_dict, k),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):  # alternate the order each round (the machine is shared)
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            fn, count = cases[name]
            samples[name].append(per_event_us(fn, count))
    us = {name: round(statistics.median(v), 2) for name, v in samples.items()}
    json_bytes = sum(len(line) + 1 for line in lines)
    pb_bytes = sum(len(f) + 4 for f in frames)
    return {
        "events": n, "event_types": {t: json_types.count(t) for t in sorted(set(json_types))},
        "bytes_per_event": {"json": round(json_bytes / n), "protobuf": round(pb_bytes / n),
                            "ratio_pb_to_json": round(pb_bytes / json_bytes, 3)},
        "us_per_event": us,
        "us_per_event_rounds": {name: [round(x, 2) for x in v] for name, v in samples.items()},
        "saving_us_per_event": round(us["json_decode_and_fields"] - us["pb_decode_and_fields"], 2),
        "saving_us_per_event_if_dicts_kept": round(us["json_decode"] - us["pb_decode"]
                                                   - us["pb_message_to_dict"], 2),
    }


# --- TLS read ----------------------------------------------------------------------------------

def serve(streams: dict[str, bytes], cert: Path, key: Path, chunk: int, ports: Any) -> None:
    """The test server (run in its own process, so the reader's CPU time is the reader's alone)."""
    from aiohttp import web

    def pieces(key: str, trickle: bool) -> list[bytes]:
        data = streams[key]
        if not trickle:
            return [data[i:i + chunk] for i in range(0, len(data), chunk)]
        if key.endswith(".pb"):
            return [struct.pack(">I", len(f)) + f for f in all_frames(data)]
        return [line + b"\n" for line in split_lines(data)[0]]

    async def handler(request: web.Request) -> web.StreamResponse:
        trickle = request.query.get("trickle") == "1"
        resp = web.StreamResponse()
        await resp.prepare(request)
        for piece in pieces(request.match_info["key"], trickle):
            await resp.write(piece)
            if trickle:  # one event per TLS record and per read, as a live watch delivers them
                await asyncio.sleep(0.001)
        await resp.write_eof()
        return resp

    serve_tls("/{key}", handler, cert, key, ports)


def serve_tls(path: str, handler: Any, cert: Path, key: Path, ports: Any) -> None:
    """Serve GET ``path`` with ``handler`` over TLS on 127.0.0.1 (a free port, put on
    ``ports``) until the process is ended (also bench/watch_coalesce.py's server)."""
    from aiohttp import web

    async def run() -> None:
        app = web.Application()
        app.router.add_get(path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(cert), str(key))
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        ports.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(run())


async def read_streams(port: int, names: list[str], counts: dict[str, int], rounds: int,
                       trickle: bool) -> dict[str, list[float]]:
    import aiohttp

    client_ctx = ssl.create_default_context()
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    samples: dict[str, list[float]] = {k: [] for k in names}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as session:
        for r in range(rounds):
            for name in (names if r % 2 == 0 else list(reversed(names))):
                split = split_frames if name.endswith(".pb") else split_lines
                t0 = time.process_time()
                events = 0
                async with session.get(f"https://127.0.0.1:{port}/{name}?trickle={int(trickle)}") as resp:
                    buf = b""
                    async for data in resp.content.iter_any():
                        got, buf = split(buf + data)
                        events += len(got)
                elapsed = time.process_time() - t0
                if events != counts[name]:
                    raise SystemExit(f"tls {name}: read {events} events, expected {counts[name]}")
                samples[name].append(elapsed / events * 1e6)
    return samples


def tls_read_us(streams: dict[str, bytes], counts: dict[str, int], cert: Path, key: Path,
                rounds: int, chunk: int) -> dict[str, Any]:
    """Serve each stream over TLS on 127.0.0.1 from a child process (``chunk``-byte writes) and
    read it here with aiohttp as Kube.watch does, splitting it into events: the reader's CPU µs
    per event (medians over rounds; each round alternates the order)."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    ports = mp.Queue()
    server = mp.Process(target=serve, args=(streams, cert, key, chunk, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=30)
        out: dict[str, Any] = {}
        for mode, trickle in (("burst", False), ("trickle", True)):
            samples = asyncio.run(read_streams(port, list(streams), counts, rounds, trickle))
            out[mode] = {"us_per_event": {k: round(statistics.median(v), 2) for k, v in samples.items()},
                         "us_per_event_rounds": {k: [round(x, 2) for x in v] for k, v in samples.items()}}
    finally:
        server.terminate()
        server.join(10)
    out["what"] = ("the reading process's CPU (aiohttp + ssl + splitting into events, no decode); burst: "
                   f"the server writes {chunk}-byte pieces back to back; trickle: one event per write, "
                   "1 ms apart (each event its own TLS record and read, as on a live watch)")
    return out


# --- main --------------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    from importlib.metadata import version

    from google.protobuf.internal import api_implementation

    return {"python": sys.version.split()[0], "orjson": version("orjson"), "protobuf": version("protobuf"),
            "protobuf_implementation": api_implementation.Type(), "grpcio-tools": version("grpcio-tools"),
            "aiohttp": version("aiohttp"), "k8s.io/api": K8S_VERSION, "k8s.io/apimachinery": K8S_VERSION}


def project(kinds: dict[str, Any], per_pod: dict[str, float], tls: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"events_per_pod": per_pod}
    for label, key in (("decode_and_fields", "saving_us_per_event"),
                       ("decode_only_dicts_kept", "saving_us_per_event_if_dicts_kept")):
        out[f"saving_ms_per_pod_{label}"] = round(sum(per_pod[k] * kinds[k][key] for k in per_pod) / 1000, 3)
    out["json_kb_per_pod"] = round(sum(per_pod[k] * kinds[k]["bytes_per_event"]["json"] for k in per_pod) / 1000, 1)
    out["protobuf_kb_per_pod"] = round(sum(per_pod[k] * kinds[k]["bytes_per_event"]["protobuf"]
                                           for k in per_pod) / 1000, 1)
    for mode in ("burst", "trickle") if tls else ():
        u = tls[mode]["us_per_event"]  # type: ignore[index]
        out[f"tls_read_saving_ms_per_pod_{mode}"] = round(sum(per_pod[k] * (u[f"{k}.json"] - u[f"{k}.pb"])
                                                              for k in per_pod) / 1000, 3)
        out[f"tls_read_json_ms_per_pod_{mode}"] = round(sum(per_pod[k] * u[f"{k}.json"] for k in per_pod) / 1000, 3)
    return out


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, help="dev cluster directory (its kubeconfig, its PKI for --tls)")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--work", type=Path, required=True, help="where the streams and generated classes go")
    ap.add_argument("--no-capture", action="store_true", help="measure the streams already in --work")
    ap.add_argument("--protos", type=Path, default=Path.home() / "go/pkg/mod/k8s.io")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to keep watching after the last Job")
    ap.add_argument("--pod-events", type=float, default=4.6, help="Pod events per pod the operator's watches add")
    ap.add_argument("--job-events", type=float, default=2.3, help="Job events per pod the operator's watches add")
    ap.add_argument("--tls", action="store_true", help="also time reading each stream over local TLS")
    ap.add_argument("--output", type=Path)
    args = ap.parse_args(list(argv) if argv is not None else None)

    load_before = os.getloadavg()
    result: dict[str, Any] = {"benchmark": "watch_encoding", "parameters": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    if not args.no_capture:
        if not args.dir:
            raise SystemExit("--dir: the dev cluster to capture from (or --no-capture)")
        result["capture"] = asyncio.run(capture(str(args.dir / "kubeconfig"), args.jobs, args.work, args.settle))
    compile_protos(args.protos, args.work / "pb")
    classes = Classes()
    streams = {k: (args.work / k).read_bytes() for k in ("pods.json", "pods.pb", "jobs.json", "jobs.pb")}
    kinds = {}
    for kind, fd, fm in (("pods", pod_fields_dict, pod_fields_msg), ("jobs", job_fields_dict, job_fields_msg)):
        lines, rest = split_lines(streams[f"{kind}.json"])
        if rest.strip():
            raise SystemExit(f"{kind}.json: {len(rest)} bytes after the last line")
        kinds[kind] = measure_kind(kind, lines, all_frames(streams[f"{kind}.pb"]), classes, args.rounds, fd, fm)
        print(kind, json.dumps({k: kinds[kind][k] for k in ("events", "bytes_per_event", "us_per_event")}),
              flush=True)
    result["per_event"] = kinds
    tls = None
    if args.tls:
        if not args.dir:
            raise SystemExit("--tls: needs --dir (the dev cluster's PKI serves as the test certificate)")
        pki = args.dir / "pki"
        counts = {f"{k}.{e}": kinds[k]["events"] for k in kinds for e in ("json", "pb")}
        tls = tls_read_us(streams, counts, pki / "apiserver.crt", pki / "apiserver.key", args.rounds, 16384)
        result["tls_read"] = tls
    result["per_pod"] = project(kinds, {"pods": args.pod_events, "jobs": args.job_events}, tls)
    result["versions"] = versions()
    result["load"] = {"before": [round(x, 2) for x in load_before],
                      "after": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=1)
    print(json.dumps(result["per_pod"], indent=1))
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
