"""The match policies by name: each one's switches for the traverser (fluxion-spec §4.1) and
the engine a matcher walks with under it."""

from __future__ import annotations

from fluxnetes.graph.model import Vertex
from fluxnetes.match.engine import Engine

# policy name -> (high, node_centric, stop_on_1, node_exclusive)   (fluxion-spec §4.1)
POLICIES: dict[str, tuple[bool, bool, bool, bool]] = {
    "first": (True, True, True, False),
    "firstnodex": (True, True, True, True),
    "low": (False, False, False, False),
    "high": (True, False, False, False),
    "lonode": (False, True, False, False),
    "hinode": (True, True, False, False),
    "lonodex": (False, True, False, True),
    "hinodex": (True, True, False, True),
    # Fluxion's own classes for these two (fluxion-spec §4.5, §4.6); their extra rules
    # are in ENGINE_EXTRAS
    "locality": (True, False, False, False),
    "variation": (False, False, False, False),
}

# policy name -> Engine keyword arguments beyond POLICIES' four flags
ENGINE_EXTRAS: dict[str, dict[str, bool]] = {
    # greater_interval_first: scores 1 + id + 1, descending everywhere, but at the root
    # candidates are ranked by the run of consecutive scores (contiguous ids) they belong to
    "locality": {"locality": True},
    # var_aware: scores 1 + perf_class, ascending at vertices and the root; slots are packed
    # with the default (descending) order
    "variation": {"perf_scores": True, "slot_high": True},
}


def new_engine(root: Vertex, policy: str, *, split_pools: bool, tie_break: str) -> Engine:
    """The traverser of ``policy`` over the tree below ``root`` (``policy`` is known)."""
    high, nc, s1, nx = POLICIES[policy]
    extra = ENGINE_EXTRAS.get(policy, {})
    return Engine(root, high=high, node_centric=nc, stop_on_1=s1, node_exclusive=nx,
                  split_pools=split_pools, exact_ties=tie_break == "fluxion",
                  slot_high=extra.get("slot_high"), perf_scores=extra.get("perf_scores", False),
                  locality=extra.get("locality", False))


def explores_every_child(policy: str, tie_break: str) -> bool:
    """Does the walk rank every child (no stop at the first fit, no node exclusivity) with
    stable ties? Then the index fast paths give the walk's answer (match/indexes.py)."""
    _high, _nc, s1, nx = POLICIES[policy]
    return not s1 and not nx and tie_break == "stable"


def is_static(policy: str) -> bool:
    """A policy with a fixed order (not `locality`/`variation`, whose order is a property of
    the candidate set): the slot index's answer at a future time (the reservation search)
    follows the static policies' order only."""
    return policy not in ENGINE_EXTRAS
