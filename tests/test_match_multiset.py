"""The matcher's min-multiset (``match/multiset.py``) against a plain list."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.match.multiset import MinMultiset


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(-5, 5)), max_size=400))
def test_min_multiset_is_a_sorted_list(ops: list[tuple[bool, int]]) -> None:
    """Adds and removes (repeats included, enough of them to trigger the rebuild of a heap
    full of stale entries): the least member, the size and the members always match."""
    m = MinMultiset()
    model: list[int] = []
    for add, value in ops:
        if add or value not in model:
            m.add(value)
            model.append(value)
        else:
            m.remove(value)
            model.remove(value)
        assert len(m) == len(model)
        assert m.sorted() == sorted(model)
        if model:
            assert m.min() == min(model)


def test_min_multiset_errors() -> None:
    m = MinMultiset()
    with pytest.raises(ValueError, match="empty"):
        m.min()
    m.add(3)
    m.remove(3)
    with pytest.raises(KeyError):
        m.remove(3)
    with pytest.raises(ValueError, match="empty"):
        m.min()


def test_min_multiset_drops_stale_entries() -> None:
    """A long run of adds and removes keeps the heap near the live size."""
    m = MinMultiset()
    for i in range(10_000):
        m.add(i)
        m.remove(i)
    m.add(7)
    assert m.min() == 7 and len(m) == 1
    assert len(m._heap) <= 2 * len(m) + 65
