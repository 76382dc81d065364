"""Prometheus metrics of the operator, and the small HTTP server that exposes them.

Other code imports :data:`METRICS` (or builds its own :class:`Metrics` on a private registry in
tests) and calls its collectors directly, e.g.::

    from fluxnetes.metrics import METRICS
    with METRICS.time_match():
        result = matcher.allocate_or_reserve(...)
    METRICS.match_outcomes.labels(outcome="reserved").inc()

Every name starts with ``fluxnetes_``; units follow Prometheus conventions (seconds, ``_total``
for counters). :func:`serve` answers ``/metrics``, ``/healthz`` and ``/readyz`` from a daemon
thread so it keeps answering while the asyncio loop of the operator is busy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

import fluxnetes

# FluxJob phases (issue 5); queue length is reported for each, zero included, so that a
# dashboard shows a flat line rather than a gap when a state empties.
QUEUE_STATES: tuple[str, ...] = (
    "Provisional",
    "Pending",
    "Reserved",
    "Running",
    "Completed",
    "Failed",
    "Cancelled",
    "Unsatisfiable",
)

# A scheduling cycle walks the whole queue: milliseconds to tens of seconds.
_CYCLE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# One match (one jobspec against the graph): sub-millisecond to a second.
_MATCH_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# The webhook target is p99 <= 5 ms, so resolve finely below that.
_WEBHOOK_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
# From a cluster event (pod bound, node changed) to the graph reflecting it.
_SYNC_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """All collectors of fluxnetes, registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            "fluxnetes_build_info", "Always 1; labels carry the version.", ["version"], registry=r
        )
        self.build_info.labels(version=fluxnetes.__version__).set(1)
        self.queue_jobs = Gauge(
            "fluxnetes_queue_jobs",
            "FluxJobs known to the queue, by state (phase).",
            ["state"],
            registry=r,
        )
        # children looked up once: .labels() takes a lock and builds a key each call, and these
        # are set on every queue change / counted on every collection (per pod, under load)
        self._queue_by_state: dict[str, Gauge] = {}
        for state in QUEUE_STATES:
            self._queue_child(state).set(0)
        self.cycle_seconds = Histogram(
            "fluxnetes_scheduling_cycle_duration_seconds",
            "Wall time of one scheduling cycle (load queue, match, persist decisions).",
            buckets=_CYCLE_BUCKETS,
            registry=r,
        )
        self.match_seconds = Histogram(
            "fluxnetes_match_duration_seconds",
            "Wall time of one match of a jobspec against the resource graph.",
            buckets=_MATCH_BUCKETS,
            registry=r,
        )
        self.match_outcomes = Counter(
            "fluxnetes_match_outcomes_total",
            "Matches by outcome: allocated, reserved, busy (no reservation), unsatisfiable, error.",
            ["outcome"],
            registry=r,
        )
        self.allocations = Counter(
            "fluxnetes_allocations_total",
            "Groups allocated (placed on nodes) by the matcher.",
            registry=r,
        )
        self.allocated_pods = Counter(
            "fluxnetes_allocated_pods_total",
            "Pods assigned to a node by fluxnetes.",
            registry=r,
        )
        self.releases = Counter(
            "fluxnetes_releases_total",
            "Releases of allocated resources: kind=partial (one pod ended) or full (job ended).",
            ["kind"],
            registry=r,
        )
        self.foreign_allocations = Counter(
            "fluxnetes_foreign_allocations_total",
            "Pods not placed by fluxnetes (other schedulers, DaemonSets, static pods) recorded in the graph.",
            registry=r,
        )
        self.foreign_pods = Gauge(
            "fluxnetes_foreign_pods",
            "Foreign pods currently holding resources in the graph.",
            registry=r,
        )
        self.sync_lag_seconds = Histogram(
            "fluxnetes_sync_lag_seconds",
            "Delay from a cluster change (source=pod|node) to the graph reflecting it.",
            ["source"],
            buckets=_SYNC_BUCKETS,
            registry=r,
        )
        self._sync_lag_by_source: dict[str, Histogram] = {}  # source -> its child (one per watch event)
        self.webhook_seconds = Histogram(
            "fluxnetes_webhook_duration_seconds",
            "Time to answer one admission review, by object kind and webhook (mutate|validate).",
            ["kind", "webhook"],
            buckets=_WEBHOOK_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "fluxnetes_reconcile_errors_total",
            "Errors raised while reconciling, by controller (pod, job, node, fluxjob, binder, ...).",
            ["controller"],
            registry=r,
        )
        self.leader = Gauge(
            "fluxnetes_leader",
            "1 while this replica holds the leader lease (and runs the queue), else 0.",
            registry=r,
        )
        self.nodes = Gauge(
            "fluxnetes_nodes",
            "Nodes in the resource graph, by status (up, down).",
            ["status"],
            registry=r,
        )
        self.gc_seconds = Counter(
            "fluxnetes_gc_seconds_total",
            "Time the process spent in Python's cyclic garbage collector, by generation "
            "(counted once track_gc() was called).",
            ["generation"],
            registry=r,
        )
        self._gc_started: float | None = None
        self._gc_by_generation: dict[int, Counter] = {}  # one child per generation (every collection)
        self._releases_by_kind: dict[str, Counter] = {}

    # -- convenience ---------------------------------------------------------------------------

    def set_queue_lengths(self, counts: Mapping[str, int]) -> None:
        """Set the queue gauge from a {state: count} map; states absent from it become 0."""
        # every state seen so far (the fixed ones and any other that was ever counted): a state
        # absent now is 0, one counted again takes its new value
        for state in counts.keys() - self._queue_by_state.keys():
            self._queue_child(state)
        for state, child in self._queue_by_state.items():
            child.set(counts.get(state, 0))

    def _queue_child(self, state: str) -> Gauge:
        child = self._queue_by_state.get(state)
        if child is None:
            child = self._queue_by_state[state] = self.queue_jobs.labels(state=state)
        return child

    def release(self, kind: str) -> None:
        """A group gave back part (``partial``) or all (``full``) of what it held."""
        child = self._releases_by_kind.get(kind)
        if child is None:
            child = self._releases_by_kind[kind] = self.releases.labels(kind=kind)
        child.inc()

    def track_gc(self) -> None:
        """Count the collector's pauses into ``gc_seconds`` (a full collection walks every
        live container object: with a large cluster cached it is the process's longest
        pause, which is why the operator freezes what it listed at start)."""
        import gc

        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def gc_total(self) -> float:
        """Seconds spent collecting so far, all generations."""
        return sum(s.value for m in self.gc_seconds.collect() for s in m.samples if s.name.endswith("_total"))

    def _on_gc(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            gen = info.get("generation", -1)
            child = self._gc_by_generation.get(gen)
            if child is None:
                child = self._gc_by_generation[gen] = self.gc_seconds.labels(
                    generation=str(gen) if gen >= 0 else "")
            child.inc(time.perf_counter() - self._gc_started)
            self._gc_started = None

    @contextmanager
    def time_cycle(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.cycle_seconds.observe(time.perf_counter() - start)

    @contextmanager
    def time_match(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.match_seconds.observe(time.perf_counter() - start)

    @contextmanager
    def time_webhook(self, kind: str, webhook: str = "mutate") -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.webhook_seconds.labels(kind=kind, webhook=webhook).observe(
                time.perf_counter() - start
            )

    def observe_sync_lag(self, source: str, event_time: float, now: float | None = None) -> None:
        """Record the lag of a change that happened at ``event_time`` (epoch seconds)."""
        current = time.time() if now is None else now
        child = self._sync_lag_by_source.get(source)
        if child is None:
            child = self._sync_lag_by_source[source] = self.sync_lag_seconds.labels(source=source)
        child.observe(max(0.0, current - event_time))

    def reconcile_error(self, controller: str) -> None:
        self.reconcile_errors.labels(controller=controller).inc()

    def exposition(self) -> bytes:
        """The text exposition format, as served on /metrics."""
        return generate_latest(self.registry)


METRICS = Metrics(REGISTRY)
"""The process-wide metrics; what the operator updates and :func:`serve` exposes by default.
On prometheus_client's default registry, so collectors made elsewhere with the library's
defaults (and the process/platform collectors) are served on the same /metrics."""


@dataclass
class Health:
    """What /healthz and /readyz report. The operator flips ``ready`` once its first sync of
    Nodes and pods is done; ``checks`` are extra named liveness probes (return False = sick)."""

    ready: bool = False
    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)

    def healthy(self) -> tuple[bool, list[str]]:
        failed = []
        for name, check in self.checks.items():
            try:
                ok = check()
            except Exception:
                ok = False
            if not ok:
                failed.append(name)
        return (not failed, failed)


class MetricsServer:
    """A running /metrics + /healthz + /readyz server (see :func:`serve`)."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve(
    port: int,
    host: str = "0.0.0.0",
    metrics: Metrics | None = None,
    health: Health | None = None,
) -> MetricsServer:
    """Serve /metrics, /healthz and /readyz on ``host:port`` (port 0 = any free port) from a
    daemon thread. Returns the server; call ``close()`` to stop it."""
    m = metrics if metrics is not None else METRICS
    h = health if health is not None else Health(ready=True)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, m.exposition(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                ok, failed = h.healthy()
                body = b"ok\n" if ok else ("failed: " + ", ".join(failed) + "\n").encode()
                self._reply(200 if ok else 503, body)
            elif path == "/readyz":
                self._reply(200 if h.ready else 503, b"ok\n" if h.ready else b"not ready\n")
            else:
                self._reply(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # probes hit these every few seconds; access logs would drown the useful ones
            return

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="fluxnetes-metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def serve_from_env(
    health: Health | None = None, environ: dict[str, str] | None = None
) -> MetricsServer | None:
    """Start :func:`serve` on ``$FLUXNETES_METRICS_PORT`` (set by the Helm chart); None when
    the variable is unset or 0. A value that is not a port raises ValueError naming it."""
    import os

    env = os.environ if environ is None else environ
    raw = env.get("FLUXNETES_METRICS_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ValueError(f"FLUXNETES_METRICS_PORT: must be a port number 0-65535, got {raw!r}")
    if int(raw) == 0:
        return None
    return serve(int(raw), health=health)
