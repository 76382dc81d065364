"""What every part of the controller shares: the API client, configuration and clock, the
event queue the informers fill, background tasks, the store journal, the "something changed,
run a cycle" flag, readiness, and the crash points of the restart tests (crashpoints.py). Every
component of the controller (controller.py) is given it as ``ctx``; ``Controller`` is one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fluxnetes.k8s import crashpoints
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.informer import Event
from fluxnetes.k8s.kube import Fenced, Kube, short, transient

if TYPE_CHECKING:
    from fluxnetes.k8s.persistence.journal import Journal

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

T = TypeVar("T")


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A background task that failed says so at once (asyncio only does when it is collected)."""
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        log.error("background task %s failed: %s", task.get_coro(), short(exc) if exc else "",
                  exc_info=exc)


class Context:
    """The shared core of the controller's parts (see the module docstring)."""

    def __init__(self, kube: Kube, config: OperatorConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.config, self.clock = kube, config, clock
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.dirty = True
        self.ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self.store_ok = True  # False while a configured store cannot be reached (/readyz)
        self.reconciled = False
        self.replay_left = 0  # initial-list events still to handle (Controller.run)
        self.journal: Journal | None = None
        if config.store:
            from fluxnetes.k8s.persistence.journal import Journal

            # store writes stop with the leader's fence, as its API writes do (journal.py)
            self.journal = Journal(config.store, fence=lambda: getattr(self.kube, "fence", None))

    # ---------------------------------------------------------------- helpers
    def now(self) -> int:
        return int(self.clock())

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)

    def wake(self) -> None:
        """Something changed: the main loop looks again now."""
        self._wake.set()

    async def until_answered(self, call: Callable[[], Awaitable[T]], still: Callable[[], bool],
                             what: str) -> T | None:
        """``call()``, sent again while the API server is away (refused, reset, timeout, 5xx,
        429) and the write is ``still`` wanted; None once it is not. A write lost to an API
        server restart would otherwise leave a pod gated or a Job suspended for good.

        A write the leader's fence refused (``Fenced``: nothing was sent) is sent again too.
        The fence closes when a renewal is late, and then either the renewal lands and the
        fence opens again, or the lease is lost and the controller stops, cancelling this task
        (the next leader's recovery places the pod). Given up, the pod of a running group
        stayed unbound for good while the lease was still held (seen under load)."""
        backoff = 0.5
        while True:
            try:
                return await call()
            except Exception as exc:
                if not (transient(exc) or isinstance(exc, Fenced)):
                    raise
                if not still():
                    return None
                log.info("%s: %s; trying again in %.1f s", what, short(exc), backoff)
            await asyncio.sleep(backoff)
            if not still():
                return None
            backoff = min(backoff * 2, 5.0)

    # ---------------------------------------------------------------- crash windows
    def crash_point(self, point: str, qid: str, **facts: object) -> bool:
        """The group ``qid`` passes a named point of the restart tests (crashpoints.py):
        False (go on) unless a hook they installed holds the step back."""
        return crashpoints.hit(point, qid, flush=self._flush_store, **facts)

    def _flush_store(self) -> None:
        if self.journal is not None:
            self.journal.drain()  # what the store was told is in the store
