"""A multi-pod group's whole allocation, written on each pod in the patch (or Binding) that
places it (annotation ``fluxnetes.io/allocation``), so that a leader that died after placing
some but not all of the group's pods, before any record of the allocation was written (the
FluxJob status comes every ``--status-interval``, ``--fluxjobs waiting`` may never write
one, no ``--store``), is followed by one that knows every slot's node and share from any
placed pod (persistence/adoption.py ``adopt_annotated``). No extra API write: the note rides
on the placement the pod gets anyway.

Text: ``{"j": jobid, "n": [[node, cores, gpus, memory MiB, slots, {extra}?], ...]}``; the
slots are the nodes' counts in order (an allocation's slots are sorted by node, so the list
of slots is each node repeated its count). Groups of one pod get none (their pod's node and
slot say it all), nor multi-role groups (their slots follow their pod sets), nor an
allocation whose text is over ``MAX_CHARS`` (the pods then say only their own slot: recovery
as before, from what is placed)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fluxnetes.k8s import names
from fluxnetes.k8s.scheduling.shares import Share

# an annotation of a few KiB per pod: ~100 nodes (the API server allows 256 KiB for all of a
# pod's annotations; each pod's placement carries the whole note, so a group's bytes grow
# with its size times its nodes)
MAX_CHARS = 4096


@dataclass(frozen=True)
class PlacedAllocation:
    """An allocation as a placed pod's note says it: the matcher job id that made it, each
    slot's node, each node's share."""

    jobid: str
    slots: tuple[str, ...]
    shares: tuple[Share, ...]


def encode(jobid: object, slots: Sequence[str], held: Sequence[Share]) -> str | None:
    """The note for an allocation (None: none is written, see the module's doc)."""
    if len(slots) < 2 or list(slots) != sorted(slots):
        return None
    count = Counter(slots)
    if set(count) - {s.node for s in held}:
        return None
    rows: list[list[Any]] = []
    for s in sorted(held, key=lambda s: s.node):
        row: list[Any] = [s.node, s.cores, s.gpus, s.memory, count[s.node]]
        if s.extra:
            row.append(dict(s.extra))
        rows.append(row)
    text = json.dumps({"j": str(jobid), "n": rows}, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= MAX_CHARS else None


def decode(text: str) -> PlacedAllocation | None:
    """The allocation a note says (None: not a note this version wrote, or malformed)."""
    try:
        doc = json.loads(text)
        jobid, rows = str(doc["j"]), doc["n"]
        slots: list[str] = []
        held: list[Share] = []
        for row in rows:
            node, cores, gpus, memory, count = str(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4])
            extra = {str(k): int(v) for k, v in (row[5] if len(row) > 5 else {}).items()}
            if count < 0 or (held and node <= held[-1].node):
                return None  # nodes in order, each once (as ``encode`` writes them)
            held.append(Share(node, cores, gpus, memory, extra))
            slots.extend([node] * count)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    if len(slots) < 2:
        return None
    return PlacedAllocation(jobid, tuple(slots), tuple(held))


def of_pod(pod: Mapping[str, Any]) -> PlacedAllocation | None:
    """The allocation a placed pod's note says (None: it has none)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.ANN_ALLOCATION)
    return decode(text) if isinstance(text, str) else None


def held_after(alloc: PlacedAllocation, released: set[int]) -> list[Share]:
    """What the allocation still holds once the ``released`` slots were given back, one by
    one in slot order, as the operator gives back a slot (allocation.py ``release_slot``: a
    node's share split evenly over the slots still on it; the last slot takes the rest)."""
    held = {s.node: s for s in alloc.shares}
    left = Counter(alloc.slots)  # slots not given back yet, per node
    for slot in sorted(released):
        if not 0 <= slot < len(alloc.slots):
            continue
        node = alloc.slots[slot]
        on_node = left[node]
        left[node] -= 1
        share = held.get(node)
        if share is None:
            continue
        rest = share - share.slot_part(on_node)
        if rest.empty:
            held.pop(node)
        else:
            held[node] = rest
    return [held[n] for n in sorted(held)]
