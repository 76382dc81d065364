"""Unit level (no cluster): once the operator's controller is ready, what it built is frozen
out of the collector's view and the collector's thresholds are raised (operator.py,
``GC_THRESHOLDS``: young collections every 700 new objects cost ~1 ms per pod otherwise)."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

from fluxnetes.k8s.operator import GC_THRESHOLDS, _freeze_when_ready


def test_ready_freezes_and_raises_the_collector_thresholds() -> None:
    was = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)

        async def main() -> None:
            ready = asyncio.Event()
            task = asyncio.ensure_future(_freeze_when_ready(SimpleNamespace(ready=ready)))  # type: ignore[arg-type]
            await asyncio.sleep(0.01)
            assert gc.get_threshold() == (700, 10, 10)  # not before the controller is ready
            ready.set()
            await task

        asyncio.run(main())
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > 700 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*was)
