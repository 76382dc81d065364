"""What fluxnetes' placed pods say of their group's allocation (read after a restart): a
pod's slot annotation (``slot_of``), the allocation note its live pods carry (``placed_note``,
allocation_note.py), and how the shares of live pods compare with the store's allocation
(``same_use``, ``store_holds_less``). Pure functions over pod and store objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fluxnetes.k8s.objects import _meta, _terminal
from fluxnetes.k8s.scheduling import allocation_note, shares
from fluxnetes.k8s.scheduling.placement import ANN_SLOT, placed_jobid


def slot_of(pod: Mapping[str, Any]) -> int | None:
    """The slot a placed pod's annotation names (None: none, or not a number)."""
    try:
        return int((_meta(pod).get("annotations") or {}).get(ANN_SLOT, ""))
    except ValueError:
        return None


def placed_note(pods: Sequence[Mapping[str, Any]]) -> allocation_note.PlacedAllocation | None:
    """The allocation the placed pods of a group carry (allocation_note.py): the note of its
    live pods' allocation (of its ended pods' when none is live); None when they carry none
    or live pods carry notes of different allocations."""
    notes: dict[str, allocation_note.PlacedAllocation] = {}
    live: set[str] = set()
    for p in pods:
        note = allocation_note.of_pod(p)
        if note is None or placed_jobid(p) != note.jobid:
            continue
        if notes.setdefault(note.jobid, note) != note:
            return None  # two pods of one allocation that disagree: neither is trusted
        if not _terminal(p):
            live.add(note.jobid)
    # a leader that adopted the allocation from its note gave it its own matcher's job id:
    # the pods it placed carry the same slots and shares under that id (leases lost several
    # times in a row). Live pods of one allocation so renumbered are one allocation.
    if len(live) > 1 and all(allocation_of(notes[j]) == allocation_of(notes[min(live)]) for j in live):
        return notes[min(live)]
    if len(live) == 1:
        return notes[live.pop()]
    return notes.popitem()[1] if not live and len(notes) == 1 else None


def allocation_of(note: allocation_note.PlacedAllocation) -> tuple[Any, ...]:
    """What an allocation is, whatever job id a leader gave it: its slots' nodes and shares."""
    return (note.slots, note.shares)


def renumbered(pod: Mapping[str, Any], note: allocation_note.PlacedAllocation) -> bool:
    """Was ``pod`` placed for the allocation ``note`` says, under another leader's job id
    (its own note the same slots and shares, under the id it was placed with)?"""
    own = allocation_note.of_pod(pod)
    return own is not None and placed_jobid(pod) == own.jobid and allocation_of(own) == allocation_of(note)


def same_use(held: Sequence[shares.Share], stored: Any) -> bool:
    """Do the shares of a group's live pods equal the store's allocation, node by node?"""
    mine = {(s.node, s.cores, s.gpus, s.memory) for s in held if not s.empty}
    theirs = {(n.name, n.cores, n.gpus, n.memory) for n in stored.nodes if n.cores or n.gpus or n.memory}
    return mine == theirs


def store_holds_less(held: Sequence[shares.Share], stored: Any) -> bool:
    """Does the store's allocation hold less than ``held`` on some node (a release the store
    saw after the note was written)? (A store that lags behind holds more, never less.)"""
    theirs = {n.name: (n.cores, n.gpus, n.memory) for n in stored.nodes}
    for s in held:
        if s.empty:
            continue
        cores, gpus, memory = theirs.get(s.node, (0, 0, 0))
        if cores < s.cores or gpus < s.gpus or memory < s.memory:
            return True
    return False
