"""Deterministic crash windows for the restart tests (``FLUXNETES_DEBUG_EXIT_AT``).

``FLUXNETES_DEBUG_EXIT_AT=<point>`` or ``<point>@<namespace>/<group>`` makes the operator exit
with status 137 (like a SIGKILL) at that point, for that group, so a test can stop it inside
a crash window and check what a restart makes of it. The points:

- ``allocated``: the store has the allocation; nothing else (no FluxJob status, no pod placed,
  the Job not resumed);
- ``placed``: the pods are placed, the FluxJob status is not written;
- ``fluxjob-running``: the FluxJob says Running, nothing is placed, the Job is not resumed;
- ``fluxjob-created``: the FluxJob object was just created (with the group's status of that
  moment: one write), nothing later written;
- ``resumed``: the Job was resumed (its pods are being created), the FluxJob not written;
- ``store-<state>`` (e.g. ``store-completed``, ``store-release``): right before the store is
  told about that transition (or partial release): the store is behind the cluster.
"""

from __future__ import annotations

import logging
import os

DEBUG_EXIT_AT = "FLUXNETES_DEBUG_EXIT_AT"

log = logging.getLogger(__name__)


def wanted(point: str, qid: str) -> bool:
    """Is the exit point ``point`` asked for, for the group ``namespace/name``?"""
    raw = os.environ.get(DEBUG_EXIT_AT, "")
    if not raw:
        return False
    want, _, target = raw.partition("@")
    return want == point and target in ("", qid)


def exit_now(point: str) -> None:
    log.warning("%s=%s: exiting here on purpose", DEBUG_EXIT_AT, point)
    logging.shutdown()
    os._exit(137)
