"""Leader election and fencing (leader.py, kube.py's Fence) against a small fake API server.

The fake server runs in a thread of its own, so it keeps answering while the test blocks
the operator's event loop the way a long scheduling cycle does. It serves one Lease and
records every other write with the (monotonic) time it arrived.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from fluxnetes.k8s.kube import PODS, Fence, Fenced, Kube
from fluxnetes.k8s.leader import LeaderElector

LEASE, DEADLINE, RETRY = 3, 2.0, 0.4


class FakeApi:
    """One Lease (GET/POST/PUT with resourceVersion conflicts) and recorded pod patches.
    ``renewals_fail`` makes every Lease PUT answer 500 (a partition between the leader and
    the API server that only the renewals notice)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes: list[float] = []
        self.renewals_fail = False
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    async def get_lease(self, _r: web.Request) -> web.Response:
        if self.lease is None:
            return web.json_response({"message": "not found"}, status=404)
        return web.json_response(self.lease)

    async def create_lease(self, r: web.Request) -> web.Response:
        if self.lease is not None:
            return web.json_response({"message": "exists"}, status=409)
        return self._store(await r.json())

    async def put_lease(self, r: web.Request) -> web.Response:
        if self.renewals_fail:
            return web.json_response({"message": "etcd unavailable"}, status=500)
        body = await r.json()
        if self.lease is None or body["metadata"].get("resourceVersion") != str(self.version):
            return web.json_response({"message": "conflict"}, status=409)
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> web.Response:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        return web.json_response(body)

    async def patch_pod(self, _r: web.Request) -> web.Response:
        self.writes.append(time.monotonic())
        return web.json_response({})

    def serve(self) -> None:
        app = web.Application()
        lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
        app.router.add_get(lease + "/lead", self.get_lease)
        app.router.add_put(lease + "/lead", self.put_lease)
        app.router.add_post(lease, self.create_lease)
        app.router.add_patch("/api/v1/namespaces/ns/pods/{name}", self.patch_pod)
        loop = asyncio.new_event_loop()
        self._loop = loop
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def stop(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    thread = threading.Thread(target=fake.serve, daemon=True)
    thread.start()
    fake._ready.wait(10)
    yield fake
    fake.stop()
    thread.join(10)


def kube_for(api: FakeApi) -> Kube:
    return Kube(f"http://127.0.0.1:{api.port}", False, {"Accept": "application/json"})


def elector(kube: Kube, identity: str) -> LeaderElector:
    return LeaderElector(kube, "ns", "lead", identity, lease_seconds=LEASE, renew_deadline=DEADLINE,
                         retry_seconds=RETRY)


def test_fence_extends_closes_and_revokes_for_good() -> None:
    f = Fence()
    with pytest.raises(Fenced, match="not the leader"):
        f.check("PATCH", "/x")
    f.extend(time.monotonic() + 5)
    assert 4 < f.check("PATCH", "/x") <= 5
    f.close()  # the lease was lost: it may be won again
    assert f.remaining() <= 0
    f.extend(time.monotonic() + 5)
    assert f.remaining() > 0
    f.revoke()  # shutting down: a renewal still in flight cannot reopen it
    f.extend(time.monotonic() + 5)
    assert f.remaining() <= 0


@pytest.mark.asyncio
async def test_a_cycle_longer_than_the_lease_cannot_write_after_the_deadline(api: FakeApi) -> None:
    """The renewals fail (partition) while a 'cycle' holds the loop for longer than the
    lease: the writes the cycle then sends are refused by the process itself, none reaches
    the API server after the fence closed, and the elector reports the loss."""
    kube = kube_for(api)
    e = elector(kube, "a")
    kube.fence = e.fence
    await e.run()
    try:
        await asyncio.wait_for(e.leading.wait(), 10)
        await kube.patch(PODS, "before", {}, "ns")  # the leader writes
        api.renewals_fail = True
        deadline = time.monotonic() + e.fence.remaining()
        time.sleep(LEASE + 0.5)  # the cycle: the loop is held past the whole lease
        with pytest.raises(Fenced):
            await kube.patch(PODS, "after", {}, "ns")
        await asyncio.wait_for(e.lost.wait(), 5)
        assert len(api.writes) == 1 and api.writes[0] < deadline
    finally:
        e.stop()
        await kube.close()


@pytest.mark.asyncio
async def test_renewal_does_not_wait_for_the_cycle(api: FakeApi) -> None:
    """A cycle holding the loop for twice the lease: the elector's thread renews meanwhile,
    so a follower never sees the lease expire and the leader may still write afterwards."""
    k1, k2 = kube_for(api), kube_for(api)
    leader, follower = elector(k1, "a"), elector(k2, "b")
    k1.fence = leader.fence
    await leader.run()
    try:
        await asyncio.wait_for(leader.leading.wait(), 10)
        await follower.run()
        time.sleep(2 * LEASE)  # the cycle
        await asyncio.sleep(RETRY * 2)
        assert not follower.leading.is_set()
        assert leader.renewals >= 3 and api.lease is not None and api.lease["spec"]["holderIdentity"] == "a"
        await k1.patch(PODS, "after-cycle", {}, "ns")
        assert not leader.lost.is_set() and len(api.writes) == 1
    finally:
        leader.stop()
        follower.stop()
        await k1.close()
        await k2.close()


@pytest.mark.asyncio
async def test_follower_takes_over_a_dead_leader_after_its_lease(api: FakeApi) -> None:
    k1, k2, k3 = kube_for(api), kube_for(api), kube_for(api)
    a, b = elector(k1, "a"), elector(k2, "b")
    await a.run()
    try:
        await asyncio.wait_for(a.leading.wait(), 10)
        await b.run()
        await asyncio.sleep(RETRY * 3)
        assert not b.leading.is_set()
        a.stop()  # dies without releasing: b waits for the lease to run out
        died = time.monotonic()
        # (bounds that only fail a broken elector: a loaded machine may be slow, never wrong)
        await asyncio.wait_for(b.leading.wait(), LEASE + 60)
        assert time.monotonic() - died > DEADLINE  # never before the old leader's fence closed
        assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "b"
        c = elector(k3, "c")
        await c.run()
        await asyncio.sleep(RETRY * 2)
        assert not c.leading.is_set()
        c.stop()
    finally:
        a.stop()
        b.stop()
        for k in (k1, k2, k3):
            await k.close()


@pytest.mark.asyncio
async def test_a_released_lease_is_taken_at_once(api: FakeApi) -> None:
    """A clean shutdown releases the Lease: the follower takes over at its next try, long
    before the (here 120 s) lease would run out; no guess about the machine's speed."""
    k1, k2 = kube_for(api), kube_for(api)
    b = LeaderElector(k1, "ns", "lead", "b", lease_seconds=120, renew_deadline=100, retry_seconds=RETRY)
    c = LeaderElector(k2, "ns", "lead", "c", lease_seconds=120, renew_deadline=100, retry_seconds=RETRY)
    await b.run()
    try:
        await asyncio.wait_for(b.leading.wait(), 60)
        await c.run()
        await asyncio.sleep(RETRY * 2)
        assert not c.leading.is_set()
        released = time.monotonic()
        await b.release()  # a clean shutdown: c takes over at its next try
        await asyncio.wait_for(c.leading.wait(), 90)
        assert time.monotonic() - released < 120  # not by the lease running out
        assert b.fence.remaining() <= 0
        c.stop()
    finally:
        b.stop()
        c.stop()
        for k in (k1, k2):
            await k.close()


OWNER = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "flx-fluxnetes",
         "uid": "u-1"}


@pytest.mark.asyncio
async def test_the_lease_is_owned_by_the_installation_so_uninstall_deletes_it(api: FakeApi) -> None:
    """Issue #28: the Lease outlived `helm uninstall`. Given an owner (the chart's ClusterRole)
    it carries the reference from its creation, and a Lease left without one (an older
    release) gains it when taken over; run from a shell (no owner) it carries none."""
    kube = kube_for(api)
    try:
        owned = LeaderElector(kube, "ns", "lead", "a", lease_seconds=LEASE, renew_deadline=DEADLINE,
                              retry_seconds=RETRY, owner=OWNER)
        assert await owned.try_acquire(kube)
        assert api.lease is not None
        assert api.lease["metadata"]["ownerReferences"] == [OWNER]
        assert await owned.try_acquire(kube)  # a renewal keeps it
        assert api.lease["metadata"]["ownerReferences"] == [OWNER]

        api.lease = None
        assert await elector(kube, "shell").try_acquire(kube)
        assert "ownerReferences" not in api.lease["metadata"]
        api.lease["spec"]["holderIdentity"] = ""  # released: the installed operator takes it
        assert await owned.try_acquire(kube)
        assert api.lease["spec"]["holderIdentity"] == "a"
        assert api.lease["metadata"]["ownerReferences"] == [OWNER]
    finally:
        await kube.close()


def test_bad_timings_are_refused() -> None:
    kube = Kube("http://127.0.0.1:1", False, {})
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(kube, "ns", "l", "a", lease_seconds=5, renew_deadline=5)
    with pytest.raises(ValueError, match="retry period"):
        LeaderElector(kube, "ns", "l", "a", lease_seconds=5, renew_deadline=3, retry_seconds=3)


@pytest.mark.asyncio
async def test_a_wedged_loop_does_not_keep_the_lease(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renewing from a thread must not keep a process whose loop never runs again in charge:
    without heartbeats the elector stops renewing, the fence closes and the loss is reported."""
    from fluxnetes.k8s import leader

    monkeypatch.setattr(leader, "STALL_SECONDS", 3.0)
    kube = kube_for(api)
    e = elector(kube, "a")
    e.heartbeat = time.monotonic()
    await e.run()
    try:
        await asyncio.wait_for(e.leading.wait(), 10)
        e.heartbeat = time.monotonic()
        await asyncio.sleep(RETRY * 2)
        assert e.fence.remaining() > 0 and not e.lost.is_set()  # fresh enough heartbeats so far
        e.heartbeat = time.monotonic() - 10  # the loop stopped beating
        await asyncio.wait_for(e.lost.wait(), DEADLINE + 60)
        assert e.fence.remaining() <= 0
    finally:
        e.stop()
        await kube.close()


@pytest.mark.parametrize(("args", "flag"), [
    (["--lease-duration", "1"], "--lease-duration"),
    (["--renew-deadline", "10"], "--renew-deadline"),
    (["--renew-deadline", "5", "--retry-period", "5"], "--retry-period"),
    (["--failure-policy", "Sometimes"], "--failure-policy"),
])
def test_run_refuses_bad_leadership_flags_naming_them(args: list[str], flag: str) -> None:
    import typer
    from typer.testing import CliRunner

    from fluxnetes.cli import run_cmd

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    run_cmd.register(app)
    res = CliRunner().invoke(app, ["run", *args])
    assert res.exit_code == 2 and flag in res.output, res.output


def test_start_up_waits_for_an_unreachable_api_server_and_fails_fast_on_configuration() -> None:
    """A replica started while the API server restarts tries again instead of exiting with a
    traceback; a configuration error (no kubeconfig file) still fails at once."""
    from fluxnetes.k8s import operator as op
    from fluxnetes.k8s.config import OperatorConfig

    async def main() -> None:
        o = op.Operator(OperatorConfig())
        tries: list[int] = []

        async def flaky_setup() -> None:
            tries.append(1)
            if len(tries) < 3:
                raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 6443)")

        o.setup = flaky_setup  # type: ignore[method-assign]
        await o._setup_when_reachable(asyncio.Event())
        assert len(tries) == 3

        async def misconfigured() -> None:
            raise FileNotFoundError(2, "No such file", "/nope/kubeconfig")

        o.setup = misconfigured  # type: ignore[method-assign]
        with pytest.raises(FileNotFoundError):
            await o._setup_when_reachable(asyncio.Event())

    asyncio.run(main())


def test_a_leader_waits_for_an_unreachable_store_instead_of_exiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--store` down while a replica takes the lead: it tries again (not ready meanwhile),
    and gives up only when told to stop."""
    from fluxnetes.k8s import operator as op
    from fluxnetes.k8s.config import OperatorConfig
    from fluxnetes.store import StoreUnavailable

    async def main() -> None:
        o = op.Operator(OperatorConfig())
        o.kube = object()  # type: ignore[assignment]  # the stand-in controller below never uses it
        tries: list[int] = []

        def flaky_controller(kube: object, config: object) -> str:
            tries.append(1)
            if len(tries) < 3:
                raise StoreUnavailable("postgresql://127.0.0.1:5432/fluxnetes: connection refused")
            return "controller"

        monkeypatch.setattr(op, "Controller", flaky_controller)
        made: object = await o._controller_when_store_answers(asyncio.Event())
        assert made == "controller"
        assert len(tries) == 3

        def down(kube: object, config: object) -> str:
            raise StoreUnavailable("connection refused")

        monkeypatch.setattr(op, "Controller", down)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        assert await o._controller_when_store_answers(stop) is None

    asyncio.run(main())
