"""The restart tests' crash-point hook (fluxnetes.k8s.crashpoints): ``FLUXNETES_DEBUG_EXIT_AT=
<point>[@<namespace>/<group>]`` makes the operator exit with status 137, like a SIGKILL, inside
that crash window, for that group (any group without ``@``). ``point`` is one of the operator's
points that stop at once (``allocated``, ``fluxjob-created``, ``resumed``, ``store-<state>``),
or one of the windows made of several points:

- ``placed``: once the group is allocated its FluxJob writes are dropped; the operator exits
  when every pod of the group is placed (the FluxJob status is not written); ``placed:<k>``:
  the same, once ``k`` of its pods are placed, the placement of any other held back (a
  group placed in part);
- ``fluxjob-running``: placement is held back (no pod placed, the Job not resumed); the
  operator exits once a FluxJob status saying Running is written.

``FLUXNETES_DEBUG_SLOW_CYCLE=SECONDS`` (the leadership tests): every scheduling cycle first
holds the event loop that long, as a huge backlog would.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from fluxnetes.k8s import crashpoints

EXIT_AT = "FLUXNETES_DEBUG_EXIT_AT"
SLOW_CYCLE = "FLUXNETES_DEBUG_SLOW_CYCLE"

log = logging.getLogger("fluxnetes.k8s.controller")


def exit_now(point: str, facts: dict[str, Any]) -> None:
    log.warning("%s=%s: exiting here on purpose", EXIT_AT, point)
    flush = facts.get("flush")
    if callable(flush):
        flush()  # what the store was told is in the store
    logging.shutdown()
    os._exit(137)


def make_hook(spec: str, exit: Callable[[str, dict[str, Any]], None] = exit_now) -> crashpoints.Hook:
    """The hook for ``FLUXNETES_DEBUG_EXIT_AT=spec``; ``exit`` is called where the process ends."""
    want, _, target = spec.partition("@")
    want, _, count = want.partition(":")  # placed:<k>: exit once k pods are placed
    allocated: set[str] = set()
    placed: dict[str, set[Any]] = {}
    placing: dict[str, set[Any]] = {}

    def hook(point: str, qid: str, facts: dict[str, Any]) -> bool:
        if target and qid != target:
            return False
        if want == "placed":
            if point == "allocated":
                allocated.add(qid)
            elif point == "fluxjob-write":
                return qid in allocated  # the FluxJob status is not written
            elif point == "pod-place" and qid in allocated and count:
                started = placing.setdefault(qid, set())
                if facts.get("pod") not in started and len(started) >= int(count):
                    return True  # only the first k pods are placed
                started.add(facts.get("pod"))
            elif point == "pod-placed" and qid in allocated:
                pods = placed.setdefault(qid, set())
                pods.add(facts.get("pod"))
                if len(pods) >= (int(count) if count else int(facts.get("size") or 0)):
                    exit(want, facts)
            return False
        if want == "fluxjob-running":
            if point == "placement":
                return True  # nothing placed, the Job not resumed
            if point == "fluxjob-written" and facts.get("phase") == "Running":
                exit(want, facts)
            return False
        if point == want:
            exit(want, facts)
        return False

    return hook


def slow_cycles(raw: str, sleep: Callable[[float], None] = time.sleep) -> crashpoints.Hook:
    """The hook for ``FLUXNETES_DEBUG_SLOW_CYCLE=raw``: hold the loop before every cycle."""
    seconds = float(raw)

    def hook(point: str, qid: str, facts: dict[str, Any]) -> bool:
        if point == "cycle":
            log.warning("%s=%s: holding the event loop %.1f s in this cycle", SLOW_CYCLE, raw, seconds)
            sleep(seconds)
        return False

    return hook


def install_from_env() -> None:
    hooks = []
    if os.environ.get(EXIT_AT, ""):
        hooks.append(make_hook(os.environ[EXIT_AT]))
    if os.environ.get(SLOW_CYCLE, "").strip():
        hooks.append(slow_cycles(os.environ[SLOW_CYCLE].strip()))
    if hooks:
        crashpoints.install(lambda point, qid, facts: any([h(point, qid, facts) for h in hooks]))
