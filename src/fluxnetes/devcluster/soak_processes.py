"""The processes a chaos soak runs beside the dev cluster (`chaos.Soak`): a private PostgreSQL
(initdb + pg_ctl in a temporary directory, so restarting it never touches anyone else's
database), a TCP forwarder standing in for the chart's webhook Service, and the operator
replicas (`python -m fluxnetes.k8s run`), the leader found by its Lease."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import procs
from fluxnetes.devcluster.cluster import Cluster
from fluxnetes.devcluster.errors import ClusterError
from fluxnetes.devcluster.net import free_ports

OPERATOR_NAMESPACE = "fluxnetes-chaos"
LEASE = "fluxnetes-leader"


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- PostgreSQL ------------------------------------------------------------------------------------
def pg_bindir() -> Path | None:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class Postgres:
    """A PostgreSQL server of our own on 127.0.0.1 (runs as `postgres` when we are root).

    host/clients: listen on another address of this machine and let `clients` (a CIDR, e.g.
    the real nodes' pods) in: the chart on the real-node dev cluster uses it as its store."""

    def __init__(self, host: str = "127.0.0.1", clients: str | None = None) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise ClusterError("PostgreSQL is not installed (initdb not found); "
                               "install the `postgresql` package or use --store sqlite")
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="fluxnetes-chaos-pg."))
        self.port = free_ports(1)[0]
        self.host = host
        self.clients = clients
        self._as: list[str] = []
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self.url = f"postgresql+psycopg://fluxnetes@{host}:{self.port}/fluxnetes"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        res = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=timeout,
                             check=False)
        if res.returncode != 0:
            raise ClusterError(f"{Path(argv[0]).name} failed: {res.stderr.strip() or res.stdout.strip()}")

    def start(self) -> Postgres:
        data = self.dir / "data"
        if not data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "fluxnetes", "--auth=trust",
                      "-E", "UTF8")
            if self.host != "127.0.0.1":  # initdb lets in loopback only
                with (data / "pg_hba.conf").open("a") as hba:
                    for who in (f"{self.host}/32", self.clients):
                        if who:
                            hba.write(f"host all all {who} trust\n")
        self._pg_ctl("start")
        if not getattr(self, "_created", False):
            self._run(str(self.bin / "createdb"), "-h", self.host, "-p", str(self.port), "-U",
                      "fluxnetes", "fluxnetes")
            self._created = True
        return self

    def _pg_ctl(self, action: str) -> None:
        opts = f"-h {self.host} -p {self.port} -k {self.dir} -c fsync=off -c max_connections=100"
        args = [str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w"]
        if action == "start":
            self._run(*args, "-o", opts, "start")
        elif action == "stop":
            self._run(*args, "-m", "fast", "stop")
        else:
            self._run(*args, "-m", "fast", "-o", opts, "restart")

    def restart(self) -> None:
        self._pg_ctl("restart")

    def stop(self) -> None:
        with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
            if (self.dir / "data" / "postmaster.pid").exists():
                self._pg_ctl("stop")
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the webhook's Service stand-in ------------------------------------------------------------------
class WebhookProxy:
    """Forwards TCP connections on 127.0.0.1:port to the first live backend, round robin."""

    def __init__(self, backends: Callable[[], list[int]]) -> None:
        self.backends = backends
        self.port = free_ports(1)[0]
        self._loop = asyncio.new_event_loop()
        self._next = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="webhook-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> WebhookProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = self.backends()
        self._next += 1
        for i in range(len(ports)):
            port = ports[(self._next + i) % len(ports)]
            try:
                r2, w2 = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
            except (OSError, TimeoutError):
                continue
            await asyncio.gather(self._pipe(reader, w2), self._pipe(r2, writer))
            return
        writer.close()

    def stop(self) -> None:
        def _close() -> None:
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(_close)
            self._thread.join(timeout=10)


# -- the operator replicas ------------------------------------------------------------------------------
@dataclass
class Replica:
    slot: int
    webhook_port: int
    metrics_port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    starts: int = 0

    @property
    def identity(self) -> str:
        return f"{socket.gethostname()}-{self.proc.pid}" if self.proc else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Replicas:
    """`count` operator processes sharing one store, one Lease and the webhook proxy."""

    def __init__(self, cluster: Cluster, store: str, log_dir: Path, count: int = 2,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.store = store
        self.log_dir = log_dir
        self.extra_args = extra_args
        ports = free_ports(2 * count)
        self.replicas = [Replica(i, ports[2 * i], ports[2 * i + 1]) for i in range(count)]
        self.proxy = WebhookProxy(lambda: [r.webhook_port for r in self.replicas if r.alive()])
        self.exits: list[dict[str, Any]] = []  # replicas that ended by themselves
        self.lock = threading.RLock()  # the fault thread kills and restarts; the main loop watches

    def start_all(self) -> None:
        self.proxy.start()
        for r in self.replicas:
            self.start(r)

    def start(self, r: Replica, wait: float = 120.0) -> None:
        r.starts += 1
        r.log = self.log_dir / f"operator-{r.slot}-{r.starts}.log"
        argv = [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(self.cluster.kubeconfig),
                "--namespace", OPERATOR_NAMESPACE, "--store", self.store,
                "--webhook-port", str(r.webhook_port),
                "--webhook-url", f"https://127.0.0.1:{self.proxy.port}",
                "--metrics-port", str(r.metrics_port), "--log-format", "text", *self.extra_args]
        with r.log.open("wb") as out:
            # ends with the soak even if the soak is killed (SIGTERM from the kernel; per thread:
            # the soak keeps the threads that start replicas alive until its teardown)
            r.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=procs.die_with_parent_hook)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and r.alive():
            if self._ready(r):
                return
            time.sleep(0.3)
        if not r.alive():
            raise ClusterError(f"operator replica {r.slot} exited at start; end of {r.log}:\n"
                               + "\n".join(r.log.read_text(errors="replace").splitlines()[-20:]))
        _say(f"operator replica {r.slot} not ready after {wait:.0f} s; going on")

    def _ready(self, r: Replica) -> bool:
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"http://127.0.0.1:{r.metrics_port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def leader(self) -> Replica | None:
        try:
            lease = self.cluster.api_get(
                f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE}")
        except (urllib.error.URLError, OSError):
            return None
        holder = (lease.get("spec") or {}).get("holderIdentity")
        for r in self.replicas:
            if r.alive() and r.identity == holder:
                return r
        return None

    def check_exits(self) -> list[dict[str, Any]]:
        """Replicas that ended on their own (not killed by us): restart them, report them."""
        ended: list[dict[str, Any]] = []
        with self.lock:
            return self._check_exits(ended)

    def _check_exits(self, ended: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is not None:
                tail = "\n".join((r.log.read_text(errors="replace") if r.log else "").splitlines()[-15:])
                ended.append({"slot": r.slot, "exit": r.proc.returncode, "log": str(r.log), "tail": tail})
                with contextlib.suppress(ClusterError):
                    self.start(r, wait=30)
        self.exits.extend(ended)
        return ended

    def kill(self, r: Replica, sig: int = signal.SIGKILL) -> None:
        procs.signal_and_wait(r.proc, sig, timeout=30)

    def stop_all(self) -> None:
        for r in self.replicas:
            self.kill(r, signal.SIGTERM)
        self.proxy.stop()
