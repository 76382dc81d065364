"""Fluxion's count rules (matcher_util ``calc_count``, fluxion-spec §2.4): how many of a
jobspec resource to take when ``qc`` are qualified. Shared by the walk (:mod:`.engine`),
the index fast paths (:mod:`.slotindex`), the pristine counts (:mod:`.pristine`) and the matcher,
so it lives apart from any of them.
"""

from __future__ import annotations

from fluxnetes.jobspec.model import UINT_MAX, Count


def calc_count(c: Count, qc: int) -> int:
    """Fluxion's matcher_util calc_count (fluxion-spec §2.4)."""
    mn, mx = c.min, c.max
    if mn > mx or mn > qc:
        return 0
    op = c.operator
    if op == "+":
        n = qc if qc < mx else mx
        n -= (n - mn) % c.operand
        return n
    if op == "*":
        if c.operand == 1:
            return mn
        cur = mn
        while cur * c.operand <= qc and cur * c.operand <= mx:
            cur *= c.operand
        return cur
    if c.operand < 2 or mn == 1:
        return mn
    cur = mn
    while cur**c.operand <= qc and cur**c.operand <= mx:
        cur = cur**c.operand
    return cur


def effective_max(c: Count) -> int:
    return calc_count(c, UINT_MAX)
