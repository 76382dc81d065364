"""Free processors over time as a step function, for counted reservations.

The fast engine's conservative backfilling plans every job as "u units from t for d
seconds". That needs exactly three things: add or remove such a span, find the earliest
``t >= now`` at which ``u`` units stay free for ``d`` seconds, and ask whether a planned span
could start earlier. Two parallel lists (breakpoints and the free count from each breakpoint
on) do all three with bisect and short scans; nothing about nodes, graphs or placements is
involved, because on identical nodes the count alone decides when a job can start.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


class CountProfile:
    """``free[i]`` units are free from ``times[i]`` until ``times[i+1]`` (the last step
    lasts forever and is always the whole machine)."""

    __slots__ = ("free", "times", "total")

    def __init__(self, total: int, start: int = 0) -> None:
        self.total = total
        self.times: list[int] = [start]
        self.free: list[int] = [total]

    def advance(self, now: int) -> None:
        """Forget the steps that ended before ``now`` (keeps the lists short)."""
        k = bisect_right(self.times, now) - 1
        if k > 32:
            del self.times[:k]
            del self.free[:k]

    def _split(self, t: int) -> int:
        times = self.times
        i = bisect_left(times, t)
        if i < len(times) and times[i] == t:
            return i
        times.insert(i, t)
        self.free.insert(i, self.free[i - 1])
        return i

    def add(self, start: int, end: int, delta: int) -> None:
        """Add ``delta`` free units over ``[start, end)`` (negative: take them)."""
        if end <= start:
            return
        i = self._split(start)
        j = self._split(end)
        free = self.free
        for k in range(i, j):
            free[k] += delta
        # merge equal neighbours at both ends, so spans that come and go leave no trace
        times = self.times
        if j < len(times) and free[j] == free[j - 1]:
            del times[j]
            del free[j]
        if i > 0 and free[i] == free[i - 1]:
            del times[i]
            del free[i]

    def free_at(self, t: int) -> int:
        return self.free[bisect_right(self.times, t) - 1]

    def earliest_before(self, now: int, duration: int, units: int, limit: int) -> int | None:
        """Earliest ``t`` in ``[now, limit)`` with ``units`` free throughout ``[t, min(t +
        duration, limit))``; None if there is none.

        This is how a planned job that holds ``[limit, limit + duration)`` asks whether it
        could start earlier: for ``t < limit`` the part of ``[t, t + duration)`` after
        ``limit`` lies inside its own span, which it would give back, so only the part
        before ``limit`` has to be free. No need to take the span out and put it back.
        """
        times = self.times
        free = self.free
        n = len(times)
        j = bisect_right(times, now) - 1
        while True:
            while free[j] < units:
                j += 1
                if j >= n or times[j] >= limit:
                    return None
            start = times[j] if times[j] > now else now
            if start >= limit:
                return None
            end = start + duration
            if end > limit:
                end = limit
            k = j + 1
            while k < n and times[k] < end:
                if free[k] < units:
                    break
                k += 1
            else:
                return start
            j = k + 1
            if j >= n or times[j] >= limit:
                return None

    def earliest(self, now: int, duration: int, units: int) -> int:
        """Earliest ``t >= now`` with ``units`` free throughout ``[t, t + duration)``."""
        times = self.times
        free = self.free
        n = len(times)
        j = bisect_right(times, now) - 1
        while True:
            while free[j] < units:
                j += 1  # the last step is the whole machine, so this stops
            start = times[j] if times[j] > now else now
            end = start + duration
            k = j + 1
            while k < n and times[k] < end:
                if free[k] < units:
                    break
                k += 1
            else:
                return start
            j = k + 1
