"""A local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, all on 127.0.0.1, with fake nodes.

    cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=10, gpus=4)))
    cluster.kubectl("get", "nodes")
    cluster.down()

With ``ClusterOptions(addons=("mpi", "jobset", "trainer", "lws"))`` it also runs the
controllers of the multi-role workload kinds, with their CRDs and webhooks (addons.py), and
with ``"kueue"`` / ``"coscheduling"`` the peers bench/peers.py measures.

Everything the cluster owns lives in one directory (state.json, kubeconfig, pki/, logs/);
etcd's data lives on /dev/shm (or the temp dir). `Cluster.attach(dir)` finds a running
cluster again from its state file, which is how `fluxnetes dev cluster down/status` work.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.devcluster import components, procs, readiness, realnode, services
from fluxnetes.devcluster.apicalls import Request, http_ok, run_async, send_all, urlopen
from fluxnetes.devcluster.components import COMPONENTS, PORT_NAMES, SERVICE_IP, kubeconfig_doc
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.nodes import (
    RACK_LABEL,
    ZONE_LABEL,
    NodeShape,
    is_ready,
)
from fluxnetes.devcluster.paths import Toolchain, default_cluster_dir, missing_message, toolchain
from fluxnetes.devcluster.pki import ClusterPKI, write_cluster_pki, write_serving_cert

STATE_FILE = "state.json"
STATE_VERSION = 1


@dataclass
class ClusterOptions:
    nodes: NodeShape = field(default_factory=NodeShape)
    dir: Path | None = None  # default: $FLUXNETES_DEV_DIR or ~/.cache/fluxnetes/dev
    k8s_home: Path | None = None  # default: $FLUXNETES_K8S_HOME or ~/.cache/fluxnetes/k8s
    advertise_address: str | None = None  # default: first non-loopback IPv4 of `hostname -I`
    # seconds for the whole start, nodes Ready included; None: start_timeout(node count)
    timeout: float | None = None
    data_root: Path | None = None  # parent of etcd's data dir; default /dev/shm (else $TMPDIR)
    die_with_parent: bool = False  # tests: processes end when the starting process dies
    log: Callable[[str], None] | None = None  # progress messages (the CLI prints them)
    # Job pods annotated components.TIMED_POD_ANNOTATION="20s" run that long (default: at once)
    timed_pods: bool = False
    # seconds Job pods without that annotation run (0: at once); > 0 implies timed_pods
    pod_duration: float = 0.0
    # controllers of multi-role workload kinds to run (devcluster/addons.py): jobset, mpi, lws,
    # trainer (addons.parse() gives the order and what each requires)
    addons: tuple[str, ...] = ()
    # real kubelet nodes beside the kwok ones (realnode.py; 0, 1 or 2; needs root and
    # hack/build-realnode.sh)
    real_nodes: int = 0
    # Services (services.py: kube-proxy, the API server reachable from pods); needs real nodes
    services: bool = False


def start_timeout(nodes: int) -> float:
    """Default seconds for `up`: 300, plus 0.1 s per node above 1,000 (700 s for 5,000 nodes,
    which took 282 s on a loaded 2-core machine: docs/scale.md)."""
    return 300.0 + 0.1 * max(0, nodes - 1000)


# every process the cluster may run, in start order (stopped in reverse)
ALL_COMPONENTS: tuple[str, ...] = (*COMPONENTS, *addon_defs.COMPONENTS)


@dataclass
class ClusterState:
    """What state.json holds: enough to find, check and stop the cluster from another process."""

    dir: str
    kubeconfig: str
    api_url: str
    ports: dict[str, int]
    advertise_address: str
    data_dir: str
    processes: list[procs.ProcessRecord] = field(default_factory=list)
    nodes: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    version: int = STATE_VERSION
    timed_pods: bool = False
    die_with_parent: bool = False
    addons: list[str] = field(default_factory=list)
    pod_duration: float = 0.0
    # slot, node names, dirs, cgroups of the real nodes (realnode.py); empty without them
    real_nodes: dict[str, Any] = field(default_factory=dict)
    # the API server's listen address: 127.0.0.1, or with Services one pods reach (services.py)
    api_host: str = "127.0.0.1"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        if raw.get("version") != STATE_VERSION:
            raise ClusterError(f"state file version {raw.get('version')!r} is not {STATE_VERSION}")
        raw["processes"] = [procs.ProcessRecord(**p) for p in raw.get("processes", [])]
        return cls(**raw)


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int
    running: bool
    log: str
    rss_mib: float | None = None  # resident memory now (None when stopped)


@dataclass(frozen=True)
class ClusterStatus:
    dir: Path
    api_url: str
    kubeconfig: Path
    processes: list[ProcessStatus]
    api_ready: bool
    nodes_total: int
    nodes_ready: int

    @property
    def healthy(self) -> bool:
        return self.api_ready and all(p.running for p in self.processes)


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open at once while choosing)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def insecure_context() -> ssl.SSLContext:
    """For the schedulers' and controller-manager's health only: their serving certificates are
    self-signed (each made its own in its --cert-dir)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def advertise_address() -> str:
    """A non-loopback IPv4 of this machine. kube-apiserver rejects loopback for
    --advertise-address; it only lands in the `kubernetes` Service endpoints and is never dialled.
    """
    env = os.environ.get("FLUXNETES_ADVERTISE_ADDRESS")
    if env:
        return env
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for word in out.split():
        if "." in word and not word.startswith("127."):
            return word
    raise ClusterError(
        "no non-loopback IPv4 address found with `hostname -I` (kube-apiserver needs one for "
        "--advertise-address); set FLUXNETES_ADVERTISE_ADDRESS to any address of this machine"
    )


def _data_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """One `up`/`down` at a time per cluster directory."""
    with (directory / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(
                f"another `fluxnetes dev cluster` command is using {directory}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Cluster:
    """A running dev cluster. Use `Cluster.up(options)` or `Cluster.attach(dir)`."""

    def __init__(
        self,
        state: ClusterState,
        tools: Toolchain,
        popens: dict[int, subprocess.Popen[bytes]] | None = None,
    ) -> None:
        self.state = state
        self.tools = tools
        self._popens = popens or {}
        self._ssl: ssl.SSLContext | None = None
        # seconds spent in each phase of `up` (control_plane, create_nodes, nodes_ready)
        self.timings: dict[str, float] = {}

    # -- what users need ---------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.state.dir)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def api_url(self) -> str:
        return self.state.api_url

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.state.ports)

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.state.processes}

    @property
    def pki(self) -> ClusterPKI:
        return ClusterPKI(self.dir / "pki")

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; raises ClusterError on failure if check."""
        argv = [
            str(self.tools.binary("kubectl")),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.dir / 'kubectl-cache'}",
            *args,
        ]
        try:
            res = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"kubectl {' '.join(args)} timed out after {timeout:.0f} s") from exc
        if check and res.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed (exit {res.returncode}): {res.stderr.strip()}"
            )
        return res

    def kubectl_json(self, *args: str, timeout: float = 120.0) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client certificate."""
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
            ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
            self._ssl = ctx
        return self._ssl

    def api_get(self, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document from the apiserver as admin (e.g. '/api/v1/nodes')."""
        req = urllib.request.Request(self.api_url + path, headers={"Accept": "application/json"})
        with urlopen(req, self.ssl_context(), timeout) as resp:
            return json.loads(resp.read())

    def api_call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> Any:
        """One request as admin; returns the decoded JSON answer (None when empty). HTTP errors
        raise urllib.error.HTTPError (its `code` says which), connection errors OSError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"Accept": "application/json", "Content-Type": content_type},
        )
        with urlopen(req, self.ssl_context(), timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def up(cls, options: ClusterOptions | None = None) -> Cluster:
        """Start every component, create the fake nodes and wait until they are Ready.

        On any failure every process started so far is stopped and the error names the
        component and shows the end of its log.
        """
        opts = options or ClusterOptions()
        shape = opts.nodes.validate()
        realnode.check_count(opts.real_nodes)
        if opts.timeout is None:
            opts = replace(opts, timeout=start_timeout(shape.count))
        tools = toolchain(opts.k8s_home)
        missing = tools.missing()
        if missing:
            raise BinariesMissing(missing_message(missing))
        try:
            wanted = addon_defs.parse(opts.addons)
        except addon_defs.AddonError as exc:
            raise ClusterError(str(exc)) from None
        absent = addon_defs.missing(wanted, tools.home)
        if absent:
            raise BinariesMissing(addon_defs.missing_message(wanted, absent))
        realnode.preflight(tools, opts.real_nodes)
        if opts.services:
            services.preflight(tools, opts.real_nodes)
        directory = (opts.dir or default_cluster_dir()).expanduser().resolve()
        directory.mkdir(parents=True, exist_ok=True)
        with dir_lock(directory):
            previous = _load_state(directory)
            if previous is not None:
                running = [p for p in previous.processes if procs.is_running(p)]
                if running:
                    raise ClusterError(
                        f"a dev cluster is already running in {directory} (pids "
                        f"{', '.join(str(p.pid) for p in running)}); stop it with "
                        f"`fluxnetes dev cluster down --dir {directory}` or use another --dir"
                    )
                services.stop(cls(previous, tools))  # a crashed run's rules,
                realnode.stop(cls(previous, tools))  # interfaces, mounts
                _cleanup(directory, previous)
            started = time.monotonic()
            # with Services the API server listens on the real nodes' interface: claimed first
            slot = services.claim() if opts.services else None
            try:
                cluster = cls._start(directory, tools, opts, slot)
            except BaseException:
                if slot is not None:
                    services.release(slot)
                raise
            cluster.timings["control_plane"] = time.monotonic() - started
        try:
            timeout = opts.timeout or start_timeout(shape.count)
            cluster.create_nodes(shape, timeout=timeout, log=opts.log)
            if opts.real_nodes:
                started = time.monotonic()
                realnode.start(cluster, opts.real_nodes, time.monotonic() + timeout,
                               opts.log or (lambda _msg: None))
                cluster.timings["real_nodes"] = time.monotonic() - started
            if opts.services:
                services.start(cluster, time.monotonic() + timeout)
            if wanted:
                cluster.start_addons(wanted, timeout=timeout, log=opts.log)
        except BaseException:
            cluster.down()
            raise
        return cluster

    @classmethod
    def _start(cls, directory: Path, tools: Toolchain, opts: ClusterOptions,
               slot: int | None = None) -> Cluster:
        say = opts.log or (lambda _msg: None)
        deadline = time.monotonic() + (opts.timeout or start_timeout(opts.nodes.count))
        logs = directory / "logs"
        run = directory / "run"
        for d in (logs, run):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        api_host = "127.0.0.1" if slot is None else services.api_host(slot)
        adv = api_host if slot is not None else (opts.advertise_address or advertise_address())
        pki = write_cluster_pki(directory / "pki", adv, SERVICE_IP)
        api_url = f"https://{api_host}:{ports['apiserver']}"
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_doc(api_url, pki), sort_keys=False))
        kubeconfig.chmod(0o600)
        root = str(opts.data_root) if opts.data_root else _data_root()
        data_dir = tempfile.mkdtemp(prefix="fluxnetes-etcd-", dir=root)
        state = ClusterState(
            dir=str(directory),
            kubeconfig=str(kubeconfig),
            api_url=api_url,
            ports=ports,
            advertise_address=adv,
            data_dir=data_dir,
            nodes=asdict(opts.nodes),
            started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            timed_pods=opts.timed_pods or opts.pod_duration > 0,
            pod_duration=opts.pod_duration,
            die_with_parent=opts.die_with_parent,
            api_host=api_host,
            # the slot's interface is removed by `down` even if the start fails
            real_nodes={} if slot is None else {"slot": slot, "count": 0, "nodes": []},
        )
        cluster = cls(state, tools)
        try:
            for name in COMPONENTS:
                say(f"starting {name}")
                cluster._spawn(name)
                cluster._wait_component(name, deadline)
            say("waiting for the default service account")
            cluster._wait_for(
                "the `default` service account (kube-controller-manager)",
                lambda: cluster._exists("/api/v1/namespaces/default/serviceaccounts/default"),
                deadline,
            )
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _spawn(self, name: str) -> procs.ProcessRecord:
        """Start one component (its log is appended to) and record it in the state file."""
        st = self.state
        run = self.dir / "run"
        if name in addon_defs.COMPONENTS:
            return self._spawn_addon(name)
        argv = components.argv(
            name,
            self.tools,
            ports=st.ports,
            kubeconfig=st.kubeconfig,
            data_dir=st.data_dir,
            advertise_address=st.advertise_address,
            api_host=st.api_host,
            pki=self.pki,
            run=run,
            timed_pods=st.timed_pods,
            pod_duration=st.pod_duration,
            nodes=int(st.nodes.get("count", 0)),
        )
        popen, rec = procs.spawn(
            name, argv, self.dir / "logs" / f"{name}.log", cwd=run,
            die_with_parent=st.die_with_parent,
        )
        return self._record(popen, rec)

    def _record(self, popen: subprocess.Popen[bytes], rec: procs.ProcessRecord) -> procs.ProcessRecord:
        st = self.state
        self._popens[rec.pid] = popen
        others = [p for p in st.processes if p.name != rec.name]
        # keep start order (ALL_COMPONENTS), so `down` stops them in reverse
        st.processes = sorted([*others, rec], key=lambda p: _start_order(p.name))
        _save_state(st)  # saved after every spawn: `down` can always find them
        return rec

    # -- for realnode.py: processes beyond the control plane, the state file, waiting ----------
    def spawn_extra(self, name: str, argv: list[str], *, cwd: Path,
                    env: dict[str, str] | None = None) -> procs.ProcessRecord:
        popen, rec = procs.spawn(name, argv, self.dir / "logs" / f"{name}.log", cwd=cwd,
                                 die_with_parent=self.state.die_with_parent, env=env)
        return self._record(popen, rec)

    def save_state(self) -> None:
        _save_state(self.state)

    def wait_for(self, what: str, check: Callable[[], bool], deadline: float,
                 interval: float = 0.2) -> None:
        self._wait_for(what, check, deadline, interval=interval)

    # -- addons: the controllers of multi-role workload kinds (devcluster/addons.py) -------------
    def _spawn_addon(self, component: str) -> procs.ProcessRecord:
        name, binary = addon_defs.COMPONENT_OF[component]
        run = self.dir / "run" / component
        run.mkdir(parents=True, exist_ok=True)
        write_serving_cert(self.pki, f"{name}-webhook", addon_defs.cert_dirs(run))
        # (the addons of one start_addons call are all in state.addons before any is spawned)
        gang = addon_defs.SCHEDULER_NAME if name == "mpi" and "coscheduling" in self.state.addons else None
        cmd = addon_defs.command(name, ports=self.state.ports, kubeconfig=self.state.kubeconfig,
                                 run=run, home=self.tools.home, binary=binary, gang_scheduler=gang)
        popen, rec = procs.spawn(
            component, cmd.argv, self.dir / "logs" / f"{component}.log", cwd=run,
            die_with_parent=self.state.die_with_parent, env=cmd.env,
        )
        return self._record(popen, rec)

    def _established(self, crd: str) -> bool:
        try:
            obj = self.api_get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        except (urllib.error.URLError, OSError):
            return False
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

    def _applies(self, path: Path) -> Callable[[], bool]:
        return lambda: self.kubectl("apply", "--server-side", f"--filename={path}", check=False).returncode == 0

    def start_addons(self, names: tuple[str, ...], timeout: float = 300.0,
                     log: Callable[[str], None] | None = None) -> None:
        """Install the CRDs of ``names`` (addons.parse order), start their managers, serve
        their webhooks and (trainer) install its training runtime."""
        say = log or (lambda _msg: None)
        started = time.monotonic()
        deadline = started + timeout
        home = self.tools.home
        st = self.state
        new = [n for n in names if n not in st.addons]
        keys = [addon_defs.port_key(n, k) for n in new for k in addon_defs.ADDONS[n].port_kinds]
        st.ports.update(zip(keys, free_ports(len(keys)), strict=True))
        st.addons = [n for n in addon_defs.ADDON_NAMES if n in {*st.addons, *new}]
        _save_state(st)
        crds = [f"--filename={f}" for n in new for f in addon_defs.crd_files(n, home)]
        if crds:
            say(f"installing the CRDs of {', '.join(new)}")
            # server-side: these CRDs are too big for client-side apply's annotation
            self.kubectl("apply", "--server-side", "--force-conflicts", *crds)
            crd_names = [addon_defs.crd_name(f) for n in new for f in addon_defs.crd_files(n, home)]
            self._wait_for("the CRDs to be Established", lambda: all(self._established(c) for c in crd_names),
                           deadline, interval=0.5)
        ca = self.pki.ca_crt.read_bytes()
        for n in new:  # all at once: each spends seconds syncing its caches
            addon = addon_defs.ADDONS[n]
            for component in addon.components:
                say(f"starting {component} ({addon.module})")
                self._spawn(component)
        for n in new:
            addon = addon_defs.ADDONS[n]
            for component in addon.components:
                self._wait_component(component, deadline)
            if addon.has_webhooks:
                port = st.ports[addon_defs.port_key(n, "webhook")]
                docs = addon_defs.webhook_configurations(n, port, ca, home)
                self.kubectl("apply", "--filename=-",
                             input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
            for f in addon_defs.runtime_files(n, home):
                say(f"installing {f.name}")
                # the webhook that validates it has just been configured: retry until served
                self._wait_for(f"{f.name} accepted", self._applies(f), deadline, interval=1.0)
        self.timings["addons"] = time.monotonic() - started

    # -- faults (the chaos soak): stop, start and restart one component --------------------------
    def stop_component(self, name: str, kill: bool = False) -> None:
        """Stop one component by its recorded pid (SIGKILL at once when `kill`); etcd's data and
        every other component stay. `start_component` brings it back."""
        if name not in ALL_COMPONENTS:
            raise ClusterError(f"unknown component {name!r} (known: {', '.join(ALL_COMPONENTS)})")
        recs = [p for p in self.state.processes if p.name == name]
        procs.stop(recs, timeout=0.0 if kill else 15.0)
        for rec in recs:
            popen = self._popens.pop(rec.pid, None)
            if popen is not None:
                with contextlib.suppress(Exception):
                    popen.wait(timeout=1)

    def start_component(self, name: str, timeout: float = 120.0) -> None:
        """Start a stopped component again with its original command line and wait until it
        serves (an API server with the same etcd, so every object is kept). With
        `die_with_parent` the process ends when the *calling thread* ends (PR_SET_PDEATHSIG)."""
        if name not in ALL_COMPONENTS:
            raise ClusterError(f"unknown component {name!r} (known: {', '.join(ALL_COMPONENTS)})")
        if any(p.name == name and procs.is_running(p) for p in self.state.processes):
            raise ClusterError(f"{name} is already running")
        self._spawn(name)
        self._wait_component(name, time.monotonic() + timeout)

    def restart_component(self, name: str, kill: bool = False, timeout: float = 120.0) -> None:
        self.stop_component(name, kill=kill)
        self.start_component(name, timeout=timeout)

    def delete_node(self, name: str) -> bool:
        """Delete a Node object (its kwok node disappears with it). False if it was not there."""
        req = Request("DELETE", f"/api/v1/nodes/{name}", {}, f"deleting node {name}",
                      ignore=frozenset({404}))
        existed = self._exists(f"/api/v1/nodes/{name}")
        self._send([req], 1)
        return existed

    def add_node(
        self,
        shape: NodeShape,
        name: str,
        zone: str | None = None,
        rack: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        """Create one more kwok node of `shape` named `name` (in `zone`/`rack`, default those of
        node 0 of the shape) and wait until it is Ready."""
        body = shape.manifest(0)
        labels = body["metadata"]["labels"]
        body["metadata"]["name"] = labels["kubernetes.io/hostname"] = name
        if zone is not None:
            labels[ZONE_LABEL] = zone
        if rack is not None:
            labels[RACK_LABEL] = rack
        self._wait_nodes({name}, time.monotonic() + timeout, 1,
                         create=[Request("POST", "/api/v1/nodes", body, f"creating node {name}")],
                         what=f"node {name} to be Ready")

    def _wait_component(self, name: str, deadline: float) -> None:
        ports = self.state.ports
        if name == "etcd":
            url = f"http://127.0.0.1:{ports['etcd']}/health"
            self._wait_for(name, lambda: http_ok(url, None), deadline)
        elif name == "kube-apiserver":
            self._wait_for(name, lambda: self._api_ok("/readyz"), deadline)
        elif name in ("kube-controller-manager", "kube-scheduler"):
            port = ports["controller_manager" if name == "kube-controller-manager" else "scheduler"]
            url = f"https://127.0.0.1:{port}/healthz"
            insecure = insecure_context()
            self._wait_for(name, lambda: http_ok(url, insecure), deadline)
        elif name in addon_defs.COMPONENTS:
            addon, binary = addon_defs.COMPONENT_OF[name]
            url = addon_defs.health_url(addon, ports, binary)
            webhook = ports.get(addon_defs.port_key(addon, "webhook"))
            hooks = addon_defs.ADDONS[addon].has_webhooks
            # a scheduler's healthz is on its secure port, with its self-signed certificate
            tls = insecure_context() if url.startswith("https:") else None
            self._wait_for(name, lambda: http_ok(url, tls) and (not hooks or port_open(webhook or 0)),
                           deadline, interval=0.5)
        else:  # kwok serves nothing; a second alive is enough, nodes turning Ready proves it
            self._wait_for(name, lambda: False, min(deadline, time.monotonic() + 1.0), quiet=True)

    def _api_ok(self, path: str) -> bool:
        return http_ok(self.api_url + path, self.ssl_context())

    def _exists(self, path: str) -> bool:
        try:
            self.api_get(path)
        except (urllib.error.URLError, OSError):
            return False
        return True

    def _wait_for(
        self,
        what: str,
        check: Callable[[], bool],
        deadline: float,
        quiet: bool = False,
        interval: float = 0.2,
    ) -> None:
        """Poll `check` until true; fail early, with its log, if a component died meanwhile."""
        while True:
            for rec in self.state.processes:
                if not procs.is_running(rec):
                    raise ClusterError(
                        f"{rec.name} exited while waiting for {what}; end of {rec.log}:\n"
                        f"{procs.log_tail(rec.log)}"
                    )
            if check():
                return
            if time.monotonic() > deadline:
                if quiet:
                    return
                logs = "".join(
                    f"\n--- {r.name} ({r.log}):\n{procs.log_tail(r.log, 8)}"
                    for r in self.state.processes[-1:]
                )
                raise ClusterError(f"timed out waiting for {what}{logs}")
            time.sleep(interval)

    def create_nodes(
        self,
        shape: NodeShape,
        timeout: float = 300.0,
        log: Callable[[str], None] | None = None,
        concurrency: int = 32,
    ) -> list[str]:
        """Create `shape.count` kwok nodes (concurrent API calls) and wait until all are Ready.

        A watch of the dev nodes follows them from before the first create, so their not-ready
        taints are lifted while the others are still being created (readiness.py)."""
        shape.validate()
        say = log or (lambda _msg: None)
        bodies = shape.manifests()
        reqs = [
            Request("POST", "/api/v1/nodes", b, f"creating node {b['metadata']['name']}")
            for b in bodies
        ]
        names = {b["metadata"]["name"] for b in bodies}
        if reqs:
            say(f"creating {len(reqs)} nodes (and waiting for them to be Ready)")
        started = time.monotonic()
        created = self._wait_nodes(names, time.monotonic() + timeout, concurrency,
                                   create=reqs, what=f"{len(names)} nodes to be Ready")
        self.timings["create_nodes"] = created - started
        self.timings["nodes_ready"] = time.monotonic() - created
        return sorted(names)

    def _send(self, reqs: list[Request], concurrency: int) -> None:
        run_async(lambda: send_all(self.api_url, self.ssl_context(), reqs, concurrency))

    def _wait_nodes(self, names: set[str], deadline: float, concurrency: int, *,
                    create: list[Request] | None = None, what: str) -> float:
        """Send `create` (at most `concurrency` at once) while watching `names` until all are
        Ready and untainted; returns when the creates ended (monotonic). Fails early, with its
        log, if a component dies; at `deadline` with the nodes still waiting and kwok's log."""
        reqs = create or []

        def check_alive() -> None:
            for rec in self.state.processes:
                if not procs.is_running(rec):
                    raise ClusterError(
                        f"{rec.name} exited while waiting for {what}; end of {rec.log}:\n"
                        f"{procs.log_tail(rec.log)}"
                    )

        async def creating() -> None:
            if reqs:
                await send_all(self.api_url, self.ssl_context(), reqs, concurrency)

        try:
            return run_async(lambda: readiness.wait_ready(
                self.api_url, self.ssl_context(), names, deadline=deadline,
                concurrency=concurrency, check_alive=check_alive, meanwhile=creating))
        except readiness.NotReadyYet as exc:
            shown = ", ".join(sorted(exc.waiting)[:3])
            logs = "".join(
                f"\n--- {r.name} ({r.log}):\n{procs.log_tail(r.log, 8)}"
                for r in self.state.processes if r.name == "kwok"
            )
            raise ClusterError(
                f"timed out waiting for {what}: {len(exc.waiting)} not Ready (e.g. {shown}); "
                f"a bigger cluster needs a longer --timeout{logs}"
            ) from None

    @classmethod
    def attach(cls, directory: Path | None = None, k8s_home: Path | None = None) -> Cluster:
        """The cluster recorded in `directory` (it may be partly or wholly stopped)."""
        d = (directory or default_cluster_dir()).expanduser().resolve()
        state = _load_state(d)
        if state is None:
            raise ClusterError(f"no dev cluster in {d} (start one with `fluxnetes dev cluster up`)")
        return cls(state, toolchain(k8s_home))

    def status(self) -> ClusterStatus:
        processes = [
            ProcessStatus(p.name, p.pid, running, p.log, procs.rss_mib(p.pid) if running else None)
            for p in self.state.processes
            for running in (procs.is_running(p),)
        ]
        api_ready = self._api_ok("/readyz")
        total = ready = 0
        if api_ready:
            with contextlib.suppress(urllib.error.URLError, OSError, KeyError):
                items = self.api_get("/api/v1/nodes?resourceVersion=0", 30)["items"]
                total = len(items)
                ready = sum(1 for n in items if is_ready(n))
        return ClusterStatus(
            self.dir, self.api_url, self.kubeconfig, processes, api_ready, total, ready
        )

    def down(self) -> list[str]:
        """Stop every process by its pid (reverse start order), delete etcd's data and the
        state file. Returns the names of processes that needed SIGKILL."""
        # clients first, then the apiserver, etcd last: an apiserver whose etcd is gone
        # retries its shutdown writes until killed
        left = services.stop(self)
        left += realnode.stop(self)  # first: its pods are deleted through the API server
        by_name = {p.name: p for p in self.state.processes}
        order: list[list[procs.ProcessRecord]] = [
            [p for p in self.state.processes if p.name not in ("kube-apiserver", "etcd")],
            [by_name[n] for n in ("kube-apiserver",) if n in by_name],
            [by_name[n] for n in ("etcd",) if n in by_name],
        ]
        killed = [name for batch in order for name in procs.stop(batch)]
        for popen in self._popens.values():
            with contextlib.suppress(Exception):
                popen.wait(timeout=1)
        _cleanup(self.dir, self.state)
        if left:
            raise ClusterError("the real nodes left behind (remove by hand):\n  " + "\n  ".join(left))
        return killed

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


# -- helpers -----------------------------------------------------------------------------------
_untaint_request = readiness.untaint_request


def _start_order(name: str) -> int:
    # real nodes' processes (realnode.py) start last
    return ALL_COMPONENTS.index(name) if name in ALL_COMPONENTS else len(ALL_COMPONENTS)


def _load_state(directory: Path) -> ClusterState | None:
    path = directory / STATE_FILE
    if not path.is_file():
        return None
    try:
        return ClusterState.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ClusterError(
            f"unreadable state file {path}: {exc}; delete it if no cluster runs"
        ) from exc


def _save_state(state: ClusterState) -> None:
    path = Path(state.dir) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(path)


def _cleanup(directory: Path, state: ClusterState) -> None:
    """Forget a stopped cluster: etcd data, state file and the now useless kubeconfig."""
    if state.data_dir and Path(state.data_dir).name.startswith("fluxnetes-etcd-"):
        shutil.rmtree(state.data_dir, ignore_errors=True)
    for name in (STATE_FILE, "kubeconfig"):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
