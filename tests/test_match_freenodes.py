"""`FreeNodes` (match/freenodes.py) against a plain model of the order it stands for.

`first` on one-core nodes: free nodes never taken come before free nodes taken before,
each by descending index; a static policy: ascending key. Random takes and gives (in any
order) must answer as the model does, ``peek`` must answer as ``take`` and take nothing.
"""

from __future__ import annotations

import random

import pytest

from fluxnetes.match.freenodes import FreeNodes, U
from fluxnetes.match.vstate import MAXW


def _model_first(free: set[int], taken: set[int], count: int) -> list[int] | None:
    if count > len(free):
        return None
    order = sorted(free, key=lambda i: (i in taken, -i))
    return sorted(order[:count])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("static", [False, True])
def test_take_and_give_follow_the_policys_order(seed: int, static: bool) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    keys = [rng.randint(-1000, 1000) * U + i for i in range(n)] if static else None
    fl = FreeNodes(n, keys)
    free = set(range(n))
    taken: set[int] = set()
    live: list[list[int]] = []
    for _ in range(400):
        if live and rng.random() < 0.45:
            nodes = live.pop(rng.randrange(len(live)))
            fl.give(nodes)
            free |= set(nodes)
            continue
        count = rng.randint(1, max(1, n // 4) + (2 if rng.random() < 0.1 else 0))
        if static:
            assert keys is not None
            want = None if count > len(free) else \
                sorted(k % U for k in sorted(keys[i] for i in free)[:count])
        else:
            want = _model_first(free, taken, count)
        assert fl.peek(count) == want
        assert fl.peek(count) == want  # (a question: nothing taken)
        got = fl.take(count)
        assert got == want
        assert len(fl) == len(free) - (len(got) if got else 0)
        if got:
            free -= set(got)
            taken |= set(got)
            live.append(got)
    if not static:
        assert [fl.weight(i) for i in range(n)] == [0 if i in taken else MAXW for i in range(n)]


@pytest.mark.parametrize("size", [3, 20])  # a give below and above SORT_FROM
def test_first_give_back_in_any_order_keeps_the_order(size: int) -> None:
    """``first`` keeps the taken-before nodes sorted whatever order a give lists them in
    (one insert each for a few, one sort for many): takes then answer as the model."""
    n = 4 * size
    fl = FreeNodes(n, None)
    free = set(range(n))
    taken: set[int] = set()
    got = [fl.take(size) for _ in range(4)]  # the whole machine, four jobs
    for nodes in got:
        assert nodes is not None
        taken |= set(nodes)
    free.clear()
    for nodes in (got[2], got[0]):
        assert nodes is not None
        shuffled = list(reversed(nodes))
        random.Random(size).shuffle(shuffled)
        fl.give(shuffled)
        free |= set(nodes)
    for count in (1, size - 1, size + 1):
        want = _model_first(free, taken, count)
        assert fl.peek(count) == want
        assert fl.take(count) == want
        fl.give(want or [])
