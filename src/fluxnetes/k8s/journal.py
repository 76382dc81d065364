"""``--store URL``: every group decision of the operator, written to the fluxnetes store.

The operator's authoritative state is the FluxJob status (it lives in etcd next to the pods it
describes, so it can never disagree with the cluster's own backup/restore). The store gets the
same decisions as a durable, queryable log (``fluxnetes store jobs``, its append-only events
table, PostgreSQL for dashboards): submissions, phase changes with reasons, allocations with
their per-node amounts, partial releases. Writes happen on one worker thread, in order, so a
slow database never stalls scheduling; a store outage is logged once and the operator goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fluxnetes.k8s.fluxjob import Phase
from fluxnetes.k8s.shares import Share

log = logging.getLogger(__name__)

_STATE = {
    Phase.PROVISIONAL: "provisional", Phase.PENDING: "pending", Phase.RESERVED: "reserved",
    Phase.RUNNING: "running", Phase.COMPLETED: "completed", Phase.FAILED: "failed",
    Phase.CANCELLED: "cancelled", Phase.UNSATISFIABLE: "unsatisfiable",
}


class Journal:
    def __init__(self, url: str) -> None:
        from fluxnetes.store import Store

        self.store = Store.open(url)
        self._ids: dict[tuple[str, str, str], int] = {}
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._failing = False
        self._thread = threading.Thread(target=self._work, name="fluxnetes-journal", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            op = self._q.get()
            if op is None:
                return
            try:
                op()
                if self._failing:
                    log.info("store writes work again")
                self._failing = False
            except Exception as exc:
                if not self._failing:
                    log.warning("store write failed (later ones are logged at debug): %s", exc)
                else:
                    log.debug("store write failed: %s", exc)
                self._failing = True

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)

    def _id(self, key: tuple[str, str, str], sub: Any, now: int) -> int:
        jid = self._ids.get(key)
        if jid is None:
            found = self.store.find(*key)
            jid = found.id if found is not None else self.store.submit_many(
                [sub], now, state=_state("provisional"))[0]
            self._ids[key] = jid
        return jid

    def phase(self, *, namespace: str, name: str, uid: str, kind: str, jobspec: str, size: int,
              duration: int, priority: int, phase: Phase, reason: str, now: int,
              shares: Sequence[Share] = (), at: int = 0) -> None:
        """Record the group (first time) and its new phase."""
        from fluxnetes.store import NodeAmount, Submission

        sub = Submission(namespace=namespace, name=name, jobspec=jobspec or "{}", size=max(1, size),
                         duration=max(0, duration), priority=priority, kind=kind or "Pod", uid=uid)
        key = (namespace, name, uid)
        target = _STATE[phase]

        def op() -> None:
            jid = self._id(key, sub, now)
            current = self.store.get(jid).state
            if str(current) == target:
                return
            if phase == Phase.RUNNING:
                nodes = [NodeAmount(name=s.node, cores=s.cores, gpus=s.gpus, memory=s.memory, extra=dict(s.extra))
                         for s in shares]
                if str(current) == "provisional":
                    self.store.transition(jid, _state("pending"), now, "queued")
                self.store.start(jid, now, at=at or now, duration=duration, nodes=nodes, reason=reason)
            else:
                if str(current) == "provisional" and target in ("reserved", "unsatisfiable"):
                    self.store.transition(jid, _state("pending"), now, "queued")
                self.store.transition(jid, _state(target), now, reason)

        self._q.put(op)

    def release_nodes(self, *, namespace: str, name: str, uid: str, nodes: Sequence[str], now: int,
                      reason: str) -> None:
        key = (namespace, name, uid)

        def op() -> None:
            jid = self._ids.get(key)
            if jid is not None:
                self.store.release_nodes(jid, nodes, now, reason)

        self._q.put(op)


def _state(name: str) -> Any:
    from fluxnetes.store import JobState

    return JobState(name)
