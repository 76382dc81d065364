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
