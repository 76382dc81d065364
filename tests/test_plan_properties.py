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
