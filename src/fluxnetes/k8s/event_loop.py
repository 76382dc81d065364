"""Which event loop the operator's process runs on: uvloop when it is installed, else asyncio's.

Why uvloop: on the shared cores, with 200 kwok nodes, the operator spent about 1.4 ms per
single-pod Job in asyncio's own loop machinery (selector polling, socket reads, TLS records,
timer heap) and part of another 1.9 ms in aiohttp's transport (py-spy split,
bench/results/operator_profile_split_single_pod_200_s38.json). uvloop does that work in C
(libuv). The operator's code does not depend on the loop: signals, executors, TLS client
connections and subprocess-free tasks behave alike on both.

The choice: ``--event-loop`` of ``fluxnetes run``, else ``$FLUXNETES_EVENT_LOOP``, else
``auto`` (uvloop if importable, asyncio's loop otherwise, said once in the log). ``asyncio``
is the opt-out; ``uvloop`` insists and fails with a clear message when it is missing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

CHOICES = ("auto", "uvloop", "asyncio")
ENV = "FLUXNETES_EVENT_LOOP"


class EventLoopError(ValueError):
    """A bad or unsatisfiable event-loop choice (the message names the setting and the rule)."""


def resolve_choice(flag: str | None) -> str:
    """The choice (one of ``CHOICES``): the flag's, else the environment variable's, else
    ``auto``; a bad value's error names where it came from."""
    if flag is not None:
        source, raw = "--event-loop", flag
    elif os.environ.get(ENV, "").strip():
        source, raw = ENV, os.environ[ENV]
    else:
        return "auto"
    choice = raw.strip().lower()
    if choice not in CHOICES:
        raise EventLoopError(f"{source}: must be one of {', '.join(CHOICES)}, got {raw!r}")
    return choice


def loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """A factory of the loop to run on, and its name (``uvloop`` or ``asyncio``)."""
    if choice not in CHOICES:
        raise EventLoopError(f"event loop: must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "asyncio":
        return asyncio.new_event_loop, "asyncio"
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise EventLoopError(f"event loop uvloop: it is not installed ({exc}); "
                                 "`pip install uvloop`, or choose auto or asyncio") from None
        return asyncio.new_event_loop, "asyncio"
    return uvloop.new_event_loop, "uvloop"
