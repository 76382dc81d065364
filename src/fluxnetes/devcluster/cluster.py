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

The options and the state file are in state.py, the admin client (kubectl, HTTPS) in
client.py, the kwok nodes in kwok_nodes.py (module map: README.md); this module runs the
processes.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml

from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.devcluster import components, procs, realnode, services
from fluxnetes.devcluster.apicalls import http_ok
from fluxnetes.devcluster.client import ClusterClient
from fluxnetes.devcluster.components import COMPONENTS, PORT_NAMES, SERVICE_IP, kubeconfig_doc
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.kwok_nodes import KwokNodes
from fluxnetes.devcluster.net import advertise_address, free_ports, insecure_context, port_open
from fluxnetes.devcluster.nodes import NodeShape, is_ready
from fluxnetes.devcluster.paths import Toolchain, default_cluster_dir, missing_message, toolchain
from fluxnetes.devcluster.pki import ClusterPKI, write_cluster_pki, write_serving_cert
from fluxnetes.devcluster.state import (
    ClusterOptions,
    ClusterState,
    ClusterStatus,
    ProcessStatus,
    cleanup,
    data_root,
    dir_lock,
    load_state,
    start_timeout,
    write_state,
)

# every process the cluster may run, in start order (stopped in reverse)
ALL_COMPONENTS: tuple[str, ...] = (*COMPONENTS, *addon_defs.COMPONENTS)


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
        self.client = ClusterClient(
            state.api_url, self.pki, tools.binary("kubectl"), self.kubeconfig,
            self.dir / "kubectl-cache",
        )
        self.nodes = KwokNodes(self.client, lambda: self.state.processes)
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
        return self.client.kubectl(*args, input=input, check=check, timeout=timeout)

    def kubectl_json(self, *args: str, timeout: float = 120.0) -> Any:
        return self.client.kubectl_json(*args, timeout=timeout)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client certificate."""
        return self.client.ssl_context()

    def api_get(self, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document from the apiserver as admin (e.g. '/api/v1/nodes')."""
        return self.client.api_get(path, timeout)

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
        return self.client.api_call(method, path, body, content_type, timeout)

    # -- kwok nodes (kwok_nodes.py) --------------------------------------------------------------
    def create_nodes(
        self,
        shape: NodeShape,
        timeout: float = 300.0,
        log: Callable[[str], None] | None = None,
        concurrency: int = 32,
    ) -> list[str]:
        """Create `shape.count` kwok nodes (concurrent API calls) and wait until all are Ready."""
        created = self.nodes.create(shape, timeout, log, concurrency)
        self.timings["create_nodes"] = created.create_s
        self.timings["nodes_ready"] = created.ready_s
        return created.names

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
        self.nodes.add(shape, name, zone, rack, timeout)

    def delete_node(self, name: str) -> bool:
        """Delete a Node object (its kwok node disappears with it). False if it was not there."""
        return self.nodes.delete(name)

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
            previous = load_state(directory)
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
                cleanup(directory, previous)
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
        root = str(opts.data_root) if opts.data_root else data_root()
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
        write_state(st)  # saved after every spawn: `down` can always find them
        return rec

    # -- for realnode.py: processes beyond the control plane, the state file, waiting ----------
    def spawn_extra(self, name: str, argv: list[str], *, cwd: Path,
                    env: dict[str, str] | None = None) -> procs.ProcessRecord:
        popen, rec = procs.spawn(name, argv, self.dir / "logs" / f"{name}.log", cwd=cwd,
                                 die_with_parent=self.state.die_with_parent, env=env)
        return self._record(popen, rec)

    def save_state(self) -> None:
        write_state(self.state)

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
        write_state(st)
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

    # -- waiting until a component serves, failing early when one exited ----------------------
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
        return self.client.api_ok(path)

    def _exists(self, path: str) -> bool:  # bench/realnode_pod_start.py uses it too
        return self.client.exists(path)

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
            procs.raise_if_exited(self.state.processes, what)
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


    @classmethod
    def attach(cls, directory: Path | None = None, k8s_home: Path | None = None) -> Cluster:
        """The cluster recorded in `directory` (it may be partly or wholly stopped)."""
        d = (directory or default_cluster_dir()).expanduser().resolve()
        state = load_state(d)
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
        cleanup(self.dir, self.state)
        if left:
            raise ClusterError("the real nodes left behind (remove by hand):\n  " + "\n  ".join(left))
        return killed

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


# -- helpers -----------------------------------------------------------------------------------
def _start_order(name: str) -> int:
    # real nodes' processes (realnode.py) start last
    return ALL_COMPONENTS.index(name) if name in ALL_COMPONENTS else len(ALL_COMPONENTS)


