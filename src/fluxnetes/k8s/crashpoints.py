"""Named points of the operator where the restart tests stop it, and the one hook they install.

A production path only says where it is: ``hit("allocated", qid)``. Nothing happens there
unless a test installed a hook (``install``); the restart tests do so in the operator
process they start (``tests/crashhook/sitecustomize.py``, driven by
``FLUXNETES_DEBUG_EXIT_AT=<point>[@<namespace>/<group>]``) and make it exit with status 137,
like a SIGKILL, inside a crash window. The points, with the facts each passes:

- ``allocated``: the store has the allocation; nothing else (no FluxJob status, no pod
  placed, the Job not resumed);
- ``placement`` (before the group's Job is resumed and its pods placed): a hook that answers
  True holds the group's placement back (no pod of the operator is placed after that);
- ``pod-place`` (``pod``: uid): one of its pods is about to be placed; a hook that answers
  True holds that placement back (the pod stays gated);
- ``pod-placed`` (``pod``: uid, ``size``: the group's pods): one of its pods was placed;
- ``fluxjob-write``: a FluxJob status write is due; a hook that answers True drops it;
- ``fluxjob-created``: the FluxJob object was just created (with the group's status of that
  moment: one write);
- ``fluxjob-written`` (``phase``): a FluxJob status saying ``phase`` was written;
- ``resumed``: the Job was resumed (its pods are being created);
- ``store-<state>`` (e.g. ``store-completed``, ``store-release``): right before the store is
  told about that transition (or that nodes were given back whole); ``store-release-part``:
  right before it is told a group holds less of a node (one of its pods there ended);
- ``cycle`` (no group: ``qid`` is empty): a scheduling cycle is about to run (the leadership
  tests' hook holds the event loop there, as a huge backlog would).

Every point passes ``flush``: what makes the store hold what it was told so far (a hook
that exits calls it first).
"""

from __future__ import annotations

from collections.abc import Callable

# (point, "namespace/name", facts) -> hold this step back?
Hook = Callable[[str, str, dict[str, object]], bool]

_hook: Hook | None = None


def install(hook: Hook | None) -> None:
    """Make ``hook`` see every point from now on (None: none again)."""
    global _hook
    _hook = hook


def hit(point: str, qid: str, **facts: object) -> bool:
    """The operator passes ``point`` for the group ``qid``: False (go on) unless an installed
    hook holds the step back."""
    return _hook is not None and _hook(point, qid, facts)
