"""Unit tests of the planners with hand-worked calendars."""

from __future__ import annotations

import pytest

from fluxnetes.plan import (
    HORIZON,
    Planner,
    PlannerError,
    PlannerInvalidError,
    PlannerMulti,
    PlannerNoFitError,
    PlannerRangeError,
    PlannerSpanNotFoundError,
)


def remaining(p: Planner) -> list[tuple[int, int]]:
    return [(pt.at, pt.remaining) for pt in p.points()]


class TestPlannerBasics:
    def test_fresh_planner_is_one_point_at_base(self) -> None:
        p = Planner(10, base=5, horizon=100)
        assert remaining(p) == [(5, 10)]
        assert p.is_idle()
        assert p.avail_at(5) == 10
        assert p.avail_during(5, 100, 10)
        assert p.end == 105
        assert Planner(1).horizon == HORIZON

    def test_half_open_spans(self) -> None:
        # calendar of 10 units: [10,20) 4 taken, [15,30) 3 taken
        p = Planner(10, horizon=100)
        a = p.add_span(10, 10, 4)
        b = p.add_span(15, 15, 3)
        assert remaining(p) == [(0, 10), (10, 6), (15, 3), (20, 7), (30, 10)]
        assert p.avail_at(9) == 10
        assert p.avail_at(10) == 6
        assert p.avail_at(19) == 3
        assert p.avail_at(20) == 7  # the first span ended at 20 (exclusive)
        assert p.avail_at(30) == 10
        assert p.avail_resources_during(0, 10) == 10
        assert p.avail_resources_during(0, 11) == 6
        assert p.avail_resources_during(12, 20) == 3
        assert p.avail_resources_during(20, 10) == 7
        assert p.avail_during(0, 10, 10)
        assert not p.avail_during(0, 11, 7)
        assert p.avail_during(20, 80, 7)
        assert not p.avail_during(20, 80, 8)
        assert p.span(a).end == 20 and p.span(b).amount == 3
        assert len(p) == 2

    def test_rem_span_restores_exactly_and_drops_points(self) -> None:
        p = Planner(10, horizon=100)
        a = p.add_span(10, 10, 4)
        b = p.add_span(10, 20, 2)
        assert remaining(p) == [(0, 10), (10, 4), (20, 8), (30, 10)]
        p.rem_span(a)
        assert remaining(p) == [(0, 10), (10, 8), (30, 10)]
        p.rem_span(b)
        assert remaining(p) == [(0, 10)]
        assert p.is_idle()
        with pytest.raises(PlannerSpanNotFoundError, match="no span with id"):
            p.rem_span(b)

    def test_span_at_base_and_horizon_end(self) -> None:
        p = Planner(3, base=0, horizon=10)
        s = p.add_span(0, 10, 3)
        assert remaining(p) == [(0, 0), (10, 3)]
        assert p.avail_time_first(0, 1, 1) is None  # the point at 10 is the horizon end
        p.rem_span(s)
        assert remaining(p) == [(0, 3)]

    def test_add_span_that_does_not_fit(self) -> None:
        p = Planner(4, horizon=100)
        p.add_span(0, 10, 3)
        with pytest.raises(PlannerNoFitError, match="not free"):
            p.add_span(5, 10, 2)
        # the failed add changed nothing
        assert remaining(p) == [(0, 1), (10, 4)]
        with pytest.raises(PlannerRangeError, match="never fits"):
            p.add_span(20, 10, 5)
        with pytest.raises(PlannerInvalidError, match="horizon"):
            p.add_span(95, 10, 1)
        with pytest.raises(PlannerInvalidError, match="duration"):
            p.add_span(5, 0, 1)
        with pytest.raises(PlannerInvalidError, match="amount"):
            p.add_span(5, 1, 0)
        assert issubclass(PlannerNoFitError, PlannerError)
        assert PlannerRangeError.errno_name == "ERANGE"

    def test_reduce_span_partial_release(self) -> None:
        p = Planner(8, horizon=100)
        s = p.add_span(10, 10, 6)
        assert p.reduce_span(s, 2) == 4
        assert p.span(s).amount == 4
        assert remaining(p) == [(0, 8), (10, 4), (20, 8)]
        assert p.reduce_span(s, 0) == 4
        with pytest.raises(PlannerInvalidError, match="cannot release 5"):
            p.reduce_span(s, 5)
        assert p.reduce_span(s, 4) == 0
        assert s not in p
        assert remaining(p) == [(0, 8)]

    def test_request_over_total(self) -> None:
        p = Planner(4)
        assert not p.avail_during(0, 10, 5)  # prune check answers instead of raising
        with pytest.raises(PlannerRangeError):
            p.avail_time_first(0, 10, 5)
        with pytest.raises(PlannerRangeError):
            list(p.avail_times(0, 10, 5))

    def test_update_total(self) -> None:
        p = Planner(4, horizon=100)
        p.add_span(0, 10, 3)
        p.update_total(6)
        assert p.avail_at(0) == 3 and p.avail_at(10) == 6
        with pytest.raises(PlannerNoFitError, match="already scheduled"):
            p.update_total(2)
        assert p.total == 6
        p.update_total(2, allow_overcommit=True)
        assert p.avail_at(0) == 0  # overcommitted: reports 0, never negative
        assert p.points()[0].remaining == -1
        assert not p.avail_during(0, 1, 1)
        assert p.avail_during(10, 5, 2)


class TestEarliestFit:
    def make(self) -> Planner:
        # 10 units; [0,10) 8 taken; [10,20) 5 taken; [20,40) 9 taken; free after 40
        p = Planner(10, horizon=1000)
        p.add_span(0, 10, 8)
        p.add_span(10, 10, 5)
        p.add_span(20, 20, 9)
        return p

    def test_first_fit_is_a_scheduled_point(self) -> None:
        p = self.make()
        assert p.avail_time_first(0, 5, 2) == 0
        assert p.avail_time_first(0, 5, 3) == 10
        assert p.avail_time_first(0, 10, 5) == 10
        assert p.avail_time_first(0, 11, 5) == 40  # [10,21) hits the 9-unit span
        assert p.avail_time_first(0, 5, 10) == 40
        assert p.avail_time_first(1, 5, 2) == 10  # on_or_after 1: only points >= 1
        assert p.avail_time_first(41, 5, 1) is None  # no point after 40
        assert p.avail_time_first(41, 5, 1, include_start=True) == 41
        assert p.avail_time_first(1, 5, 2, include_start=True) == 1

    def test_window_must_end_within_horizon(self) -> None:
        p = self.make()
        assert p.avail_time_first(0, 960, 3) == 40
        assert p.avail_time_first(0, 961, 3) is None

    def test_avail_times_iterates_points(self) -> None:
        p = self.make()
        assert list(p.avail_times(0, 5, 1)) == [0, 10, 20, 40]
        assert list(p.avail_times(0, 5, 3)) == [10, 40]
        assert list(p.avail_times(0, 15, 2)) == [0, 40]

    def test_avail_times_sees_changes_between_steps(self) -> None:
        p = self.make()
        it = p.avail_times(0, 5, 3)
        assert next(it) == 10
        p.add_span(40, 10, 10)
        assert next(it) == 50


class TestPlannerMulti:
    def test_vector_spans(self) -> None:
        m = PlannerMulti({"core": 64, "gpu": 4}, horizon=1000)
        assert m.types == ("core", "gpu")
        s = m.add_span(0, 100, {"core": 60, "gpu": 0})
        assert m.avail_at(50) == {"core": 4, "gpu": 4}
        assert m.avail_during(0, 100, {"core": 4, "gpu": 4})
        assert not m.avail_during(0, 100, [5, 0])
        assert m.avail_during(100, 10, [64, 4])
        assert m.span(s).counts == {"core": 60, "gpu": 0}
        with pytest.raises(PlannerNoFitError, match="'core'"):
            m.add_span(50, 100, {"core": 10, "gpu": 1})
        assert m.avail_at(50) == {"core": 4, "gpu": 4}  # all or nothing
        with pytest.raises(PlannerRangeError):
            m.add_span(0, 10, {"gpu": 5})
        with pytest.raises(PlannerInvalidError, match="expected 2 counts"):
            m.avail_during(0, 10, [1])

    def test_untracked_type_has_zero_total(self) -> None:
        m = PlannerMulti({"core": 4})
        assert not m.avail_during(0, 10, {"gpu": 1})
        assert m.avail_during(0, 10, {"gpu": 0, "core": 4})
        with pytest.raises(PlannerRangeError):
            m.avail_time_first(0, 10, {"gpu": 1})

    def test_reduce_and_remove(self) -> None:
        m = PlannerMulti({"node": 2, "core": 8}, horizon=1000)
        s = m.add_span(10, 10, {"node": 2, "core": 8})
        assert m.reduce_span(s, {"node": 1, "core": 4}) is False
        assert m.avail_at(10) == {"node": 1, "core": 4}
        with pytest.raises(PlannerInvalidError, match="cannot release"):
            m.reduce_span(s, {"core": 5})
        assert m.reduce_span(s, {"node": 1}) is False
        assert m.span(s).counts == {"node": 0, "core": 4}
        assert m.reduce_span(s, {"core": 4}) is True
        assert s not in m
        assert [len(v) for v in m.points().values()] == [1, 1]
        z = m.add_span(0, 5, {})
        assert m.span(z).counts == {"node": 0, "core": 0}
        m.rem_span(z)
        with pytest.raises(PlannerSpanNotFoundError):
            m.rem_span(z)

    def test_earliest_fit_uses_union_of_points(self) -> None:
        # cores are free from 0 on; gpus busy until 30. Fluxion would draw candidates from
        # the first type (core) only and find none after 0; the union finds 30.
        m = PlannerMulti({"core": 8, "gpu": 2}, horizon=1000)
        m.add_span(0, 30, {"gpu": 2})
        m.add_span(0, 10, {"core": 8})
        assert m.avail_time_first(0, 10, {"core": 1, "gpu": 1}) == 30
        assert m.avail_time_first(0, 10, {"core": 1}) == 10
        assert list(m.avail_times(0, 10, {"core": 8, "gpu": 1})) == [30]
        assert list(m.avail_times(0, 10, {"core": 1})) == [10, 30]
        assert m.avail_time_first(31, 10, {"core": 1}) is None
        assert m.avail_time_first(31, 10, {"core": 1}, include_start=True) == 31

    def test_update_totals_and_add_type(self) -> None:
        m = PlannerMulti({"core": 4}, horizon=100)
        m.add_span(0, 10, {"core": 3})
        with pytest.raises(PlannerNoFitError):
            m.update_totals({"core": 2, "gpu": 1})
        assert m.types == ("core",)  # checked before any change
        m.update_totals({"core": 8, "gpu": 1})
        assert m.types == ("core", "gpu")
        assert m.avail_at(0) == {"core": 5, "gpu": 1}
        with pytest.raises(PlannerInvalidError, match="already tracked"):
            m.add_type("gpu", 3)
        m.add_type("memory", 256)
        assert m.totals() == {"core": 8, "gpu": 1, "memory": 256}


class TestBadArguments:
    def test_planner_rejects_bad_arguments_with_clear_errors(self) -> None:
        p = Planner(4, base=10, horizon=100)
        with pytest.raises(PlannerInvalidError, match="outside the planner horizon"):
            p.avail_at(9)
        with pytest.raises(PlannerInvalidError, match="outside the planner horizon"):
            p.avail_at(110)
        with pytest.raises(PlannerInvalidError, match="amount must be >= 0"):
            p.avail_during(10, 5, -1)
        with pytest.raises(PlannerInvalidError, match="before the planner base"):
            p.avail_time_first(9, 5, 1)
        with pytest.raises(PlannerInvalidError, match="total must be >= 0"):
            Planner(-1)
        with pytest.raises(PlannerSpanNotFoundError, match="no span with id 7"):
            p.span(7)
        with pytest.raises(PlannerSpanNotFoundError):
            p.reduce_span(7, 1)

    def test_multi_rejects_bad_arguments(self) -> None:
        m = PlannerMulti({"core": 4}, horizon=100)
        with pytest.raises(PlannerInvalidError, match="count of 'core' must be >= 0"):
            m.avail_during(0, 5, {"core": -1})
        with pytest.raises(PlannerInvalidError, match="not tracked"):
            m.planner("gpu")
        with pytest.raises(PlannerInvalidError, match="outside the planner horizon"):
            m.add_span(90, 20, {"core": 1})
        assert m.avail_resources_during(0, 100) == {"core": 4}
