"""Property tests: the planners agree with a brute-force calendar on random histories."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.plan import (
    Planner,
    PlannerMulti,
    PlannerNoFitError,
    PlannerRangeError,
)

H = 40  # horizon of the small calendars used here (base 0)


@dataclass
class Model:
    """Brute force: remaining(t) recomputed from the list of live spans at every instant."""

    total: int
    spans: dict[int, list[int]] = field(default_factory=dict)  # id -> [start, end, amount]

    def remaining(self, t: int) -> int:
        return self.total - sum(a for s, e, a in self.spans.values() if s <= t < e)

    def points(self) -> list[int]:
        pts = {0}
        for s, e, _a in self.spans.values():
            pts.add(s)
            pts.add(e)
        return sorted(pts)

    def avail_during(self, t: int, d: int, a: int) -> bool:
        return a <= self.total and all(self.remaining(x) >= a for x in range(t, t + d))

    def first_fit(self, on_or_after: int, d: int, a: int) -> int | None:
        for c in self.points():
            if c >= on_or_after and c + d <= H and self.avail_during(c, d, a):
                return c
        return None


# one operation: (kind, x, y, z) interpreted per kind
ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "rem", "reduce", "query", "first"]),
        st.integers(0, H - 1),
        st.integers(1, H),
        st.integers(0, 12),
    ),
    max_size=40,
)


def check_state(p: Planner, m: Model) -> None:
    pts = p.points()
    assert [pt.at for pt in pts] == m.points()
    for pt in pts:
        assert pt.remaining == m.remaining(pt.at)
        assert pt.remaining >= 0
    for t in range(H):
        assert p.avail_at(t) == m.remaining(t)


def sweep_first_fit(p: Planner, m: Model) -> None:
    """Earliest fit for a grid of requests (random single queries rarely hit the corners)."""
    for on_or_after in (0, 1, 4, 9, 17, 30):
        for d in (1, 3, 7, 20):
            for a in range(1, m.total + 1):
                assert p.avail_time_first(on_or_after, d, a) == m.first_fit(on_or_after, d, a)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 10), history=ops)
def test_planner_matches_brute_force(total: int, history: list[tuple[str, int, int, int]]) -> None:
    p = Planner(total, base=0, horizon=H)
    m = Model(total)
    for kind, x, y, z in history:
        d = min(y, H - x)  # keep windows inside the horizon
        if kind == "add":
            amount = max(z, 1)
            fits = m.avail_during(x, d, amount)
            try:
                sid = p.add_span(x, d, amount)
            except PlannerRangeError:
                assert amount > total
            except PlannerNoFitError:
                assert not fits and amount <= total
            else:
                assert fits
                m.spans[sid] = [x, x + d, amount]
        elif kind == "rem" and m.spans:
            sid = sorted(m.spans)[x % len(m.spans)]
            p.rem_span(sid)
            del m.spans[sid]
        elif kind == "reduce" and m.spans:
            sid = sorted(m.spans)[x % len(m.spans)]
            held = m.spans[sid][2]
            amount = z % (held + 1)
            left = p.reduce_span(sid, amount)
            assert left == held - amount
            if left == 0:
                del m.spans[sid]
                assert sid not in p
            else:
                m.spans[sid][2] = left
                assert p.span(sid).amount == left
        elif kind == "query":
            assert p.avail_during(x, d, z) == m.avail_during(x, d, z)
            window_min = min(m.remaining(t) for t in range(x, x + d))
            assert p.avail_resources_during(x, d) == window_min
        elif kind == "first":
            if z > total:
                continue
            assert p.avail_time_first(x, y, z) == m.first_fit(x, y, z)
            expected = [c for c in m.points() if c >= x and c + y <= H and m.avail_during(c, y, z)]
            assert list(p.avail_times(x, y, z)) == expected
        check_state(p, m)
        sweep_first_fit(p, m)
    # removing everything restores the pristine calendar exactly
    for sid in list(m.spans):
        p.rem_span(sid)
    assert [(pt.at, pt.remaining, pt.refs) for pt in p.points()] == [(0, total, 1)]


multi_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "rem", "reduce", "query", "first"]),
        st.integers(0, H - 1),
        st.integers(1, H),
        st.tuples(st.integers(0, 5), st.integers(0, 3)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    totals=st.tuples(st.integers(1, 5), st.integers(1, 3)),
    history=multi_ops,
)
def test_planner_multi_matches_brute_force(
    totals: tuple[int, int], history: list[tuple[str, int, int, tuple[int, int]]]
) -> None:
    types = ("core", "gpu")
    pm = PlannerMulti(dict(zip(types, totals, strict=True)), base=0, horizon=H)
    models = [Model(t) for t in totals]
    multi_spans: dict[int, list[int]] = {}  # id -> counts

    def union_points() -> list[int]:
        return sorted({pt for mm in models for pt in mm.points()})

    def fits(t: int, d: int, counts: tuple[int, ...]) -> bool:
        return all(mm.avail_during(t, d, c) for mm, c in zip(models, counts, strict=True))

    for kind, x, y, counts in history:
        d = min(y, H - x)
        if kind == "add":
            ok = fits(x, d, counts)
            try:
                sid = pm.add_span(x, d, counts)
            except (PlannerNoFitError, PlannerRangeError):
                assert not ok
            else:
                assert ok
                multi_spans[sid] = list(counts)
                for i, (mm, c) in enumerate(zip(models, counts, strict=True)):
                    if c:
                        mm.spans[sid * 10 + i] = [x, x + d, c]
        elif kind == "rem" and multi_spans:
            sid = sorted(multi_spans)[x % len(multi_spans)]
            pm.rem_span(sid)
            del multi_spans[sid]
            for i, mm in enumerate(models):
                mm.spans.pop(sid * 10 + i, None)
        elif kind == "reduce" and multi_spans:
            sid = sorted(multi_spans)[x % len(multi_spans)]
            held = multi_spans[sid]
            release = [c % (h + 1) for c, h in zip(counts, held, strict=True)]
            removed = pm.reduce_span(sid, dict(zip(types, release, strict=True)))
            for i, mm in enumerate(models):
                held[i] -= release[i]
                key = sid * 10 + i
                if key in mm.spans:
                    if held[i] == 0:
                        del mm.spans[key]
                    else:
                        mm.spans[key][2] = held[i]
            assert removed == (sum(held) == 0)
            if removed:
                del multi_spans[sid]
            else:
                assert list(pm.span(sid).counts.values()) == held
        elif kind == "query":
            assert pm.avail_during(x, d, counts) == fits(x, d, counts)
            assert pm.avail_during(x, d, dict(zip(types, counts, strict=True))) == fits(
                x, d, counts
            )
        elif kind == "first":
            if any(c > t for c, t in zip(counts, totals, strict=True)):
                continue
            expected = [c for c in union_points() if c >= x and c + y <= H and fits(c, y, counts)]
            assert pm.avail_time_first(x, y, counts) == (expected[0] if expected else None)
            assert list(pm.avail_times(x, y, counts)) == expected
        for typ, mm in zip(types, models, strict=True):
            check_state(pm.planner(typ), mm)
        for on_or_after in (0, 3, 11, 25):
            for d in (1, 4, 15):
                for req in ((1, 0), (0, 1), (totals[0], 1), (1, totals[1])):
                    expected = [
                        c
                        for c in union_points()
                        if c >= on_or_after and c + d <= H and fits(c, d, req)
                    ]
                    got = pm.avail_time_first(on_or_after, d, req)
                    assert got == (expected[0] if expected else None)
    for sid in list(multi_spans):
        pm.rem_span(sid)
    assert all(len(pts) == 1 for pts in pm.points().values())


# ---------------------------------------------------------------------------- keyed API
# The matcher's hot paths use the trusted, keyed API (put / pop / free / fits, end-based
# windows). Histories below grow past SMALL spans so that both representations (scanning
# the spans, and the scheduled points built lazily and then maintained) are exercised, and
# they mix in the checked API that relies on those points.

keyed_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "put", "pop", "free", "first", "add"]),
        st.integers(0, H - 1),
        st.integers(1, H),
        st.integers(0, 6),
    ),
    max_size=60,
)


@settings(max_examples=250, deadline=None)
@given(total=st.integers(1, 12), history=keyed_ops)
def test_keyed_planner_matches_brute_force(
    total: int, history: list[tuple[str, int, int, int]]
) -> None:
    p = Planner(total, base=0, horizon=H)
    m = Model(total)
    next_key = 1000
    for kind, x, y, z in history:
        end = min(x + y, H)
        if kind == "put":
            # trusted: no fit check, so usage may exceed the total (remaining goes negative)
            p.put(next_key, x, end, z)
            m.spans[next_key] = [x, end, z]
            next_key += 1
        elif kind == "add":
            amount = max(z, 1)
            fits = m.avail_during(x, end - x, amount) and amount <= total
            try:
                sid = p.add_span(x, end - x, amount)
            except (PlannerNoFitError, PlannerRangeError):
                assert not fits
            else:
                assert fits
                m.spans[sid] = [x, end, amount]
        elif kind == "pop" and m.spans:
            key = sorted(m.spans)[x % len(m.spans)]
            s, e, a = m.spans.pop(key)
            assert p.pop(key) == (s, e, a)
            assert p.pop(key) is None
        elif kind == "free":
            expected = min(m.remaining(t) for t in range(x, end))
            assert p.free(x, end) == expected
            assert p.fits(x, end, z) == (z <= total and expected >= z)
        elif kind == "first" and 1 <= z <= total and all(m.remaining(t) >= 0 for t in range(H)):
            assert p.avail_time_first(x, y, z) == m.first_fit(x, y, z)
        assert len(p) == len(m.spans)
        assert p.used == sum(a for _s, _e, a in m.spans.values())
        for t in (0, x, end - 1):
            assert p.free(t, t + 1) == m.remaining(t)
    for key in list(m.spans):
        p.pop(key)
    assert p.is_idle() and p.used == 0
    assert [(pt.at, pt.remaining) for pt in p.points()] == [(0, total)]


multi_keyed_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "pop", "fits", "times"]),
        st.integers(0, H - 1),
        st.integers(1, H),
        st.tuples(st.integers(0, 4), st.integers(0, 2)),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(totals=st.tuples(st.integers(1, 6), st.integers(1, 3)), history=multi_keyed_ops)
def test_keyed_planner_multi_matches_brute_force(
    totals: tuple[int, int], history: list[tuple[str, int, int, tuple[int, int]]]
) -> None:
    types = ("core", "gpu")
    pm = PlannerMulti(dict(zip(types, totals, strict=True)), base=0, horizon=H)
    models = [Model(t) for t in totals]
    keys: dict[int, tuple[int, int]] = {}
    next_key = 1
    for kind, x, y, counts in history:
        end = min(x + y, H)
        if kind == "put":
            # stay within the totals so the union-of-points search is well defined
            if all(mm.avail_during(x, end - x, c) for mm, c in zip(models, counts, strict=True)):
                pm.put(next_key, x, end, counts)
                keys[next_key] = counts
                for mm, c in zip(models, counts, strict=True):
                    if c:
                        mm.spans[next_key] = [x, end, c]
                next_key += 1
        elif kind == "pop" and keys:
            key = sorted(keys)[x % len(keys)]
            assert pm.pop(key) == keys.pop(key)
            for mm in models:
                mm.spans.pop(key, None)
            assert pm.pop(key) is None
        elif kind == "fits":
            req = {"core": counts[0], "gpu": counts[1], "untracked": 5}
            expected = all(
                mm.avail_during(x, end - x, c) for mm, c in zip(models, counts, strict=True)
            )
            assert pm.fits(req, x, end) == expected
            for i, mm in enumerate(models):
                assert pm.free(i, x, end) == min(mm.remaining(t) for t in range(x, end))
        elif kind == "times":
            req = {"core": counts[0], "gpu": counts[1]}
            union = sorted({pt for mm in models for pt in mm.points()})
            expected = [
                c
                for c in union
                if c >= x
                and c + y <= H
                and all(mm.avail_during(c, y, n) for mm, n in zip(models, counts, strict=True))
            ]
            if any(n > t for n, t in zip(counts, totals, strict=True)):
                expected = []
            assert list(pm.fit_times(x, y, req)) == expected
    for key in list(keys):
        pm.pop(key)
    assert all(len(pts) == 1 for pts in pm.points().values())


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(1, 8), history=ops, probe=st.tuples(st.integers(0, H - 1), st.integers(1, H))
)
def test_first_fit_excluding_a_span_is_the_search_without_it(
    total: int, history: list[tuple[str, int, int, int]], probe: tuple[int, int]
) -> None:
    """first_fit(exclude=k) (the queue profile's "could this reservation move earlier?")
    answers as if span k were removed, and leaves the planner exactly as it was."""
    p = Planner(total, base=0, horizon=H)
    m = Model(total)
    for _kind, x, y, z in history:
        amount = max(1, z)
        if amount <= total and x + y <= H and m.avail_during(x, y, amount):
            m.spans[p.add_span(x, y, amount)] = [x, x + y, amount]
    on_or_after, d = probe
    before = p.points()
    for key in [None, *m.spans]:
        without = Model(total, {k: v for k, v in m.spans.items() if k != key})
        for a in range(0, total + 2):
            got = p.first_fit(on_or_after, d, a, exclude=key)
            if a > total:
                assert got is None
                continue
            # the search without the span: candidates are on_or_after and the points after it
            cands = sorted({on_or_after} | {t for t in m.points() if t > on_or_after})
            want = next((c for c in cands if c + d <= H and without.avail_during(c, d, a)), None)
            assert got == want
        assert p.points() == before


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 8), history=ops, d=st.integers(1, H))
def test_fits_before_is_first_fit_compared_with_a_time(
    total: int, history: list[tuple[str, int, int, int]], d: int
) -> None:
    """fits_before(t, d, a, before, exclude=k) (the compress walk's "could this reservation
    move earlier?") is first_fit(t, d, a, exclude=k) < before, None only where first_fit
    is None (past the horizon, more than the total), and leaves the planner as it was: for
    every span excluded or none, every amount, start and bound (the points and the horizon)."""
    p = Planner(total, base=0, horizon=H)
    for _kind, x, y, z in history:
        amount = max(1, z)
        if amount <= total and x + y <= H and p.avail_during(x, y, amount):
            p.add_span(x, y, amount)
    points = p.points()
    bounds = sorted({pt.at for pt in points} | {pt.at + 1 for pt in points} | {H})
    for key in [None, *p.keys()]:
        for a in range(0, total + 2):
            for on_or_after in range(0, H, 2):
                low = p.first_fit(on_or_after, d, a, exclude=key)
                for before in bounds:
                    got = p.fits_before(on_or_after, d, a, before, exclude=key)
                    if got is None:  # (the caller then asks first_fit itself)
                        assert low is None
                    else:
                        assert got == (low is not None and low < before), (key, a, low)
    assert p.points() == points
