"""The operator process: bootstrap (CRD, certificate, webhook), leadership, then the controller.

Why not kopf: fluxnetes needs a namespaceSelector on its webhook configuration, a Lease for
leadership, its own certificate, no annotation writes on every handled pod, and one ordered
state machine over all pods and nodes. kopf's managed webhook configuration has no
namespaceSelector, its peering is not Lease-based and its handlers annotate objects, so
each of these would be worked around; a list-watch loop and an aiohttp server are shorter.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from typing import Any

from fluxnetes.k8s import certs
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.admission.hold import PLACEMENTS
from fluxnetes.k8s.admission.install import (
    apply_config,
    ensure_accounts_crd,
    ensure_cert,
    ensure_crd,
    ensure_namespace,
    find_owner,
    wait_webhook_ready,
    whoami,
)
from fluxnetes.k8s.admission.webhook import WebhookPortError, WebhookServer
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.controller import Controller
from fluxnetes.k8s.kube import (
    MUTATING,
    POLICIES,
    POLICY_BINDINGS,
    VALIDATING,
    ApiError,
    Kube,
    short,
    transient,
)
from fluxnetes.k8s.leader import LeaderElector

log = logging.getLogger(__name__)



class Operator:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.kube: Kube | None = None
        self.webhook: WebhookServer | None = None
        self.controller: Controller | None = None
        self._standby: asyncio.Future[Controller | None] | None = None  # a follower's (_stand_by)
        self.elector: LeaderElector | None = None
        self.owner: webhook_config.Owner | None = None  # setup (find_owner)
        self.operators: set[str] = set()
        self.webhook_url = ""
        from fluxnetes.metrics import Health

        self.health = Health()
        self.metrics_server: Any = None
        self.setup_done = False
        self.finished = threading.Event()  # set once main() is done (see shutdown_deadline)
        self._side_tasks: list[asyncio.Future[Any]] = []
        self._mutating_for: Any = None  # kinds -> the mutating configuration (setup)

    def readiness(self) -> bool:
        """/readyz: the leader once it has synced Nodes and pods (and reached its store, when
        one is configured); a standby once its webhook serves (that is all it does)."""
        if self.controller is not None:
            return self.controller.ready.is_set() and self.controller.store_ok
        return self.setup_done and self.elector is not None and not self.elector.leading.is_set()

    async def _track_readiness(self) -> None:
        while True:
            self.health.ready = self.readiness()
            await asyncio.sleep(0.5)

    async def setup(self) -> None:
        cfg = self.config
        self.kube = kube = await Kube.from_config(cfg.kubeconfig, cfg.context, cfg.api_concurrency)
        # independent round trips, sent together: under load each one waits its turn at the
        # API server, and this is the start of every restart's path to the first bind
        checks = [ensure_namespace(kube, cfg.namespace), ensure_crd(kube)]
        if cfg.fairshare != "off":
            checks.append(ensure_accounts_crd(kube, cfg))
        me, *_ = await asyncio.gather(whoami(kube), *checks)
        self.operators = {me} if me else set()
        log.info("operator identity: %s", me or "(unknown)")
        if cfg.leader_elect and self._standby is None:
            # the cluster is listed while the webhook starts (its own process) and the lease
            # is sought: a restarted leader takes its lease back at once, then waits only for
            # what is left of the list
            self._standby = asyncio.ensure_future(self._stand_by())
        # the webhook configurations, their certificate and the leader Lease are owned by the
        # installation's ClusterRole: uninstalling deletes them (webhook_config.Owner)
        self.owner = owner = await find_owner(kube, cfg.owner_cluster_role)
        if cfg.webhook:
            hosts = ["127.0.0.1", "localhost"]
            if cfg.service_name:
                hosts = [f"{cfg.service_name}.{cfg.namespace}.svc", f"{cfg.service_name}.{cfg.namespace}.svc.cluster.local", *hosts]
            bundle = await ensure_cert(kube, cfg.namespace, hosts, owner)
            self.webhook = WebhookServer(cfg.webhook_host, cfg.webhook_port, bundle, lambda: self.operators,
                                         job_mode=cfg.job_mode, share_port=cfg.webhook_share_port,
                                         hold=PLACEMENTS[cfg.placement])
            port = await self.webhook.start_in_process()
            if cfg.service_name:
                target = webhook_config.WebhookTarget(service_name=cfg.service_name, service_namespace=cfg.namespace)
            else:
                self.webhook_url = cfg.webhook_url or f"https://127.0.0.1:{port}"
                target = webhook_config.WebhookTarget(url=self.webhook_url)
            scope = webhook_config.Scope(namespace_label=cfg.namespace_label, own_namespace=cfg.namespace,
                                         failure_policy=cfg.failure_policy,
                                         admit_template_pods=cfg.admit_template_pods)
            own = webhook_config.owned
            from fluxnetes.k8s.groups.podset_groups import addon_kinds_served

            def mutating_for(kinds: list[Any]) -> dict[str, Any]:
                return own(webhook_config.mutating(target, scope, bundle.ca_crt, multi_role=kinds), owner)

            self._mutating_for = mutating_for
            # the multi-role kinds whose CRD is served get admission rules (the leader logs the
            # others, one line each, and adds them when their CRD appears: see _lead)
            await apply_config(kube, MUTATING, mutating_for(await addon_kinds_served(kube)))
            policy, binding = webhook_config.gate_policy(scope, sorted(self.operators))
            if cfg.placement == "bind":
                # no gate to protect (the scheduler name holds pods, and it is immutable); the
                # rule would only cost a CEL evaluation on every update of every managed pod
                await kube.delete(POLICY_BINDINGS, binding["metadata"]["name"])
                await kube.delete(POLICIES, policy["metadata"]["name"])
                await kube.delete(VALIDATING, webhook_config.NAME)
            else:
                await self.protect_gate(kube, policy, binding, target, scope, bundle, owner)
            await wait_webhook_ready(kube, cfg.namespace_label, owner=owner)

    async def _install_multi_role(self, kinds: list[Any]) -> None:
        """A multi-role kind's CRD appeared: admission rules for it too."""
        assert self.kube is not None
        await apply_config(self.kube, MUTATING, self._mutating_for(kinds))
        log.info("admission rules now cover %s", ", ".join(k.kind for k in kinds) or "no multi-role kind")

    async def protect_gate(self, kube: Kube, policy: dict[str, Any], binding: dict[str, Any],
                           target: webhook_config.WebhookTarget, scope: webhook_config.Scope,
                           bundle: certs.CertBundle, owner: webhook_config.Owner | None) -> None:
        """Only the operator may lift the gate: a ValidatingAdmissionPolicy, or the validating
        webhook on API servers without that API."""
        own = webhook_config.owned
        try:
            await apply_config(kube, POLICIES, own(policy, owner))
            await apply_config(kube, POLICY_BINDINGS, own(binding, owner))
            await kube.delete(VALIDATING, webhook_config.NAME)
        except ApiError as exc:
            if exc.status != 404:
                raise
            log.info("no ValidatingAdmissionPolicy API; protecting the gate with a webhook")
            await apply_config(kube, VALIDATING, own(webhook_config.validating(target, scope, bundle.ca_crt), owner))

    async def run(self, stop: asyncio.Event | None = None) -> None:
        from fluxnetes.metrics import METRICS, serve

        stop = stop or asyncio.Event()
        # the first line: what came before it is the interpreter's start and the imports
        log.info("operator starting: pid %d", os.getpid())
        METRICS.leader.set(0)
        METRICS.track_gc()
        if self.config.metrics_port:
            self.metrics_server = serve(self.config.metrics_port, self.config.metrics_host, health=self.health)
            log.info("metrics on http://%s:%d/metrics (/healthz, /readyz)", self.config.metrics_host,
                     self.metrics_server.port)
        tracker = asyncio.ensure_future(self._track_readiness())
        if self.config.store:
            threading.Thread(target=_import_store, name="fluxnetes-import-store", daemon=True).start()
        try:
            await self._setup_when_reachable(stop)
        except BaseException:
            tracker.cancel()
            await self._drop_standby()
            if self.metrics_server is not None:
                self.metrics_server.close()
            if self.kube is not None:
                await self.kube.close()
            raise
        self.setup_done = True
        assert self.kube is not None
        try:
            if not self.config.leader_elect:
                await self._lead(stop)
                return
            cfg = self.config
            self.elector = elector = LeaderElector(
                self.kube, cfg.namespace, cfg.lease_name, cfg.identity, lease_seconds=cfg.lease_seconds,
                renew_deadline=cfg.renew_deadline, retry_seconds=cfg.retry_period,
                owner=self.owner.reference() if self.owner else None)
            # every write of the leader checks the fence the elector extends on each renewal
            self.kube.fence = elector.fence
            self._side_tasks.append(asyncio.ensure_future(self._beat(elector)))
            await elector.run()
            while not stop.is_set():
                # while another replica leads, this one lists and watches the cluster (its
                # informers muted): taking over then starts from a listed cluster
                if self._standby is None:  # (the first one started during setup)
                    self._standby = asyncio.ensure_future(self._stand_by())
                await _first(stop.wait(), elector.leading.wait(), elector.lost.wait())
                if elector.error is not None:
                    raise elector.error
                if stop.is_set():
                    return
                if not await self._lead(stop):
                    return
                if elector.error is not None:
                    raise elector.error
                log.warning("stepped down (the lease could not be renewed in time); competing for it again")
                elector.rejoin()
        finally:
            await self._drop_standby()
            await self._shutdown(tracker)

    async def _stand_by(self) -> Controller | None:
        """The controller of a replica that does not lead yet: made (its store opened) and its
        informers listed and watching, muted (``Controller.watch``). None if the store does
        not answer or the watch fails: the replica then starts cold when it leads."""
        from fluxnetes.store import StoreUnavailable

        assert self.kube is not None
        try:
            controller = Controller(self.kube, self.config)
        except StoreUnavailable as exc:
            log.info("standby: the store is not reachable (%s); the cluster is listed when leading", short(exc))
            return None
        try:
            await controller.watch(standby=True)
        except BaseException as exc:
            await controller.stop()
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("standby: watching the cluster failed (%s); it is listed again when leading", short(exc))
            return None
        log.info("standby: the cluster is listed and watched; waiting to lead")
        return controller

    async def _take_standby(self, stop: asyncio.Event) -> Controller | None:
        """The standby controller once it is ready (None: there is none, it failed, or the
        stop came first)."""
        task, self._standby = self._standby, None
        if task is None:
            return None
        waits: list[Any] = [task, stop.wait()]
        if self.elector is not None:
            waits.append(self.elector.lost.wait())
        await _first(*waits)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return None if task.cancelled() or task.exception() is not None else task.result()

    async def _drop_standby(self) -> None:
        task, self._standby = self._standby, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        made = None if task.cancelled() or task.exception() is not None else task.result()
        if made is not None:
            await made.stop()

    async def _setup_when_reachable(self, stop: asyncio.Event) -> None:
        """``setup``, tried again while the API server is unreachable or answers 5xx/429 (a
        replica started during an API server restart must wait for it, not exit with a
        traceback); a missing permission or bad configuration still fails at once."""
        backoff = 1.0
        while True:
            try:
                await self.setup()
                return
            except Exception as exc:
                if not transient(exc) or stop.is_set():
                    raise
                log.warning("start-up: the API server is not reachable (%s); trying again in %.0f s",
                            short(exc), backoff)
            # what the failed attempt had opened is made again by the next one
            await self._drop_standby()
            if self.webhook is not None:
                await self.webhook.stop()
                self.webhook = None
            if self.kube is not None:
                await self.kube.close()
                self.kube = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            if stop.is_set():
                raise SystemExit(0)
            backoff = min(backoff * 2, 10.0)

    @staticmethod
    async def _beat(elector: LeaderElector) -> None:
        """Tell the elector the loop runs (a wedged loop must not keep the lease: leader.py)."""
        while True:
            elector.heartbeat = time.monotonic()
            await asyncio.sleep(1)

    async def _lead(self, stop: asyncio.Event) -> bool:
        """Run the controller until ``stop`` (False) or the lease is lost (True)."""
        from fluxnetes.metrics import METRICS

        assert self.kube is not None
        METRICS.leader.set(1)
        made = await self._take_standby(stop)
        if made is None and not stop.is_set():
            made = await self._controller_when_store_answers(stop)
        if made is None:
            METRICS.leader.set(0)
            return self.elector is not None and self.elector.lost.is_set() and not stop.is_set()
        self.controller = controller = made
        if self._mutating_for is not None:
            controller.podsets.on_kinds_changed = self._install_multi_role
        run = asyncio.ensure_future(controller.run())
        frozen = asyncio.ensure_future(_freeze_when_ready(controller))
        try:
            waits = [stop.wait(), run] + ([self.elector.lost.wait()] if self.elector is not None else [])
            await _first(*waits)
            if run.done() and not run.cancelled() and run.exception() is not None:
                raise run.exception()  # type: ignore[misc]
            return self.elector is not None and self.elector.lost.is_set() and not stop.is_set()
        finally:
            METRICS.leader.set(0)
            self.health.ready = False
            frozen.cancel()
            run.cancel()
            await controller.stop()
            await asyncio.gather(run, return_exceptions=True)
            self.controller = None
            gc.unfreeze()  # the stepped-down controller's objects become collectable again

    async def _controller_when_store_answers(self, stop: asyncio.Event) -> Controller | None:
        """The controller, once its store (``--store``) answers: a leader started while the
        database restarts waits for it (not ready, the lease kept) instead of exiting; None
        when told to stop or the lease is lost meanwhile. A bad store URL still fails at once."""
        from fluxnetes.store import StoreUnavailable

        assert self.kube is not None
        backoff = 1.0
        while True:
            try:
                return Controller(self.kube, self.config)
            except StoreUnavailable as exc:
                log.warning("the store is not reachable (%s); trying again in %.0f s", short(exc), backoff)
            waits: list[Any] = [stop.wait()]
            if self.elector is not None:
                waits.append(self.elector.lost.wait())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(_first(*waits), backoff)
            if stop.is_set() or (self.elector is not None and self.elector.lost.is_set()):
                return None
            backoff = min(backoff * 2, 10.0)

    def begin_shutdown(self) -> None:
        """The stop signal arrived (maybe in the middle of a cycle): no write from now on."""
        if self.elector is not None:
            self.elector.fence.revoke()

    def shutdown_deadline(self, grace: float) -> None:
        """From a thread: if the process has not finished ``grace`` seconds after the stop
        signal (a long scheduling cycle holds the loop), give the lease up and exit now."""
        if self.finished.wait(grace):
            return
        log.warning("still busy %.1f s after the stop signal (a scheduling cycle holds the loop): releasing "
                    "the lease and exiting without waiting", grace)
        if self.elector is not None:
            self.elector.release_blocking(0.3)
        logging.shutdown()
        os._exit(0)

    async def _shutdown(self, tracker: asyncio.Future[Any]) -> None:
        from fluxnetes.metrics import METRICS

        METRICS.leader.set(0)
        self.health.ready = False
        self.begin_shutdown()
        tracker.cancel()
        for t in self._side_tasks:
            t.cancel()
        if self.controller is not None:
            await self.controller.stop()
        if self.elector is not None:
            await self.elector.release()  # the follower takes over at its next look (every second)
            self.elector.stop()
        if self.webhook is not None:
            await self.webhook.stop()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.kube is not None:
            await self.kube.close()
        await asyncio.gather(tracker, return_exceptions=True)


def _import_store() -> None:
    """Import the store's modules (SQLAlchemy, Alembic, psycopg: over a second of a loaded
    core) while the start-up waits for the API server and the webhook process, instead of
    once the lease is won, where each second delays the first bind after a restart. A
    failure here is left to the import that needs the module (it then says why)."""
    with contextlib.suppress(Exception):
        import alembic.command
        import alembic.runtime.migration
        import alembic.script  # noqa: F401
        import psycopg  # noqa: F401

        import fluxnetes.k8s.persistence.journal  # noqa: F401


# The collector's thresholds once the start-up's objects are frozen. Each watch event decodes
# into a few hundred new objects, so Python's defaults (a young collection every 700 net new
# objects, a full one every 100 young ones) collected all the time: 0.4-1.5 ms of the
# operator's ~7 ms of CPU per single-pod Job went there (up to 2.5 ms per pod of a gang),
# against 0.1-0.4 ms with these (operator_bench's operator_gc_ms_per_pod, 200 and 1,000 nodes;
# docs/scale.md). Only garbage in reference cycles waits longer to be freed (reference counting
# frees the rest at once); the operator's RSS did not change (operator_rss_mb).
GC_THRESHOLDS = (10_000, 20, 10)


async def _freeze_when_ready(controller: Controller) -> None:
    """Once the controller has listed and recovered the cluster, what it holds (informer
    caches, graph, groups) lives about as long as the process: it is moved out of the
    garbage collector's view, so that full collections walk only what came after (a full
    walk of a 5,000-node cluster's objects is a pause of seconds), and the collector runs less
    often (``GC_THRESHOLDS``). Objects frozen are still freed when their last reference goes."""
    from fluxnetes.metrics import METRICS

    await controller.ready.wait()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.info("start-up: %d objects out of the collector's view; %.2f s spent collecting so far",
             gc.get_freeze_count(), METRICS.gc_total())


async def _first(*aws: Any) -> None:
    """Wait until the first of ``aws`` is done; cancel the others (tasks given are kept)."""
    futs = [a if isinstance(a, asyncio.Future) else asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(futs, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f, a in zip(futs, aws, strict=True):
            if f is not a:
                f.cancel()


SHUTDOWN_GRACE = 1.5  # seconds from SIGTERM to exit, even in the middle of a cycle


def main(config: OperatorConfig) -> None:
    operator = Operator(config)

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signalled: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            # a Python-level handler runs in the main thread at the next bytecode, even in the
            # middle of a scheduling cycle; the loop only sees its callbacks once the cycle ends
            if signalled:
                log.warning("second stop signal: exiting now")
                operator.shutdown_deadline(0)
            signalled.append(signum)
            log.info("stop signal %s: stepping down", signal.Signals(signum).name)
            operator.begin_shutdown()
            loop.call_soon_threadsafe(stop.set)
            threading.Thread(target=operator.shutdown_deadline, args=(SHUTDOWN_GRACE,),
                             name="fluxnetes-shutdown", daemon=True).start()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                # asyncio's handler makes the signal wake the loop (its wakeup fd); ours does the work
                loop.add_signal_handler(sig, stop.set)
                signal.signal(sig, on_signal)
        await operator.run(stop)

    from fluxnetes.k8s.event_loop import loop_factory
    from fluxnetes.store import StoreConfigError, StoreUnavailable

    factory, loop_name = loop_factory(config.event_loop)
    log.info("event loop: %s (--event-loop %s)", loop_name, config.event_loop)
    try:
        # asyncio.Runner, not asyncio.run: Python 3.11's run() takes no loop factory
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_run())
    except (StoreUnavailable, StoreConfigError) as exc:
        log.error("store: %s", exc)  # the message names the database (password hidden)
        raise SystemExit(2) from None
    except WebhookPortError as exc:
        log.error("webhook: %s", exc)
        raise SystemExit(2) from None
    except ApiError as exc:
        if not exc.forbidden:
            raise
        # a missing RBAC permission is a configuration error, not a bug: say which, and exit
        log.error(exc.permission_hint())
        raise SystemExit(2) from None
    finally:
        operator.finished.set()
