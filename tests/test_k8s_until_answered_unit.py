"""Context.until_answered: which refused writes are sent again (no cluster).

A write the leader's own fence refused must wait for the fence: a late renewal that lands
opens it again, and the write must then go out. It used to be given up at once, so a pod of
a running group stayed unbound for good while the lease was still held (bench/peers.py,
row e, at load ~20)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.kube import ApiError, Fence


def _ctx() -> Context:
    return Context(object(), OperatorConfig(), clock=lambda: 1_000)  # type: ignore[arg-type]


def test_a_write_the_fence_refused_goes_out_once_the_renewal_lands() -> None:
    fence = Fence()
    fence.extend(time.monotonic() + 60)
    fence.close()  # a renewal is late: writes are refused meanwhile
    sent: list[str] = []

    async def write() -> str:
        fence.check("POST", "/api/v1/namespaces/ns/pods/p/binding")
        sent.append("binding")
        return "bound"

    async def main() -> Any:
        async def renewal_lands() -> None:
            await asyncio.sleep(0.2)
            fence.extend(time.monotonic() + 60)

        renew = asyncio.ensure_future(renewal_lands())
        got = await _ctx().until_answered(write, lambda: True, "binding ns/p")
        await renew
        return got

    assert asyncio.run(main()) == "bound"
    assert sent == ["binding"]


def test_a_fenced_write_no_longer_wanted_is_dropped() -> None:
    fence = Fence()  # never opened: every write is refused

    async def write() -> str:
        fence.check("POST", "/x")
        return "sent"

    wanted = iter([True, False])
    assert asyncio.run(_ctx().until_answered(write, lambda: next(wanted), "x")) is None


def test_a_refused_object_is_not_sent_again() -> None:
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        raise ApiError(422, {"message": "invalid"}, "POST", "/x")

    with pytest.raises(ApiError):
        asyncio.run(_ctx().until_answered(write, lambda: True, "x"))
    assert calls == 1
