"""A faithful model of libstdc++'s ``std::sort`` (introsort) for reproducing Fluxion's ties.

Fluxion sorts candidate groups with ``std::sort`` and a comparator on the score only, so
equal-score candidates (e.g. core0 of four identical nodes under policy ``low``) come out in
the order introsort happens to leave them. The reference answers depend on that order, so
this module replays the same algorithm step by step (median-of-three pivot, unguarded
partition, heap-sort fallback, final insertion sort with threshold 16). It is written from
the algorithm's published description, not copied.

``introsort(keys, items)`` sorts ``items`` in place by ascending ``keys`` (``keys`` is
permuted alongside). When all keys are distinct the result equals any correct sort, so the
caller uses Python's sort then.
"""

from __future__ import annotations

from typing import Any

_THRESHOLD = 16


def introsort(keys: list[Any], items: list[Any]) -> None:
    n = len(keys)
    if n < 2:
        return
    depth = 2 * (n.bit_length() - 1)
    _introsort_loop(keys, items, 0, n, depth)
    _final_insertion_sort(keys, items, 0, n)


def _swap(k: list[Any], it: list[Any], a: int, b: int) -> None:
    k[a], k[b] = k[b], k[a]
    it[a], it[b] = it[b], it[a]


def _introsort_loop(k: list[Any], it: list[Any], first: int, last: int, depth: int) -> None:
    while last - first > _THRESHOLD:
        if depth == 0:
            _partial_sort(k, it, first, last, last)
            return
        depth -= 1
        cut = _partition_pivot(k, it, first, last)
        _introsort_loop(k, it, cut, last, depth)
        last = cut


def _partition_pivot(k: list[Any], it: list[Any], first: int, last: int) -> int:
    mid = first + (last - first) // 2
    _move_median_to_first(k, it, first, first + 1, mid, last - 1)
    return _unguarded_partition(k, it, first + 1, last, first)


def _move_median_to_first(k: list[Any], it: list[Any], result: int, a: int, b: int, c: int) -> None:
    if k[a] < k[b]:
        if k[b] < k[c]:
            _swap(k, it, result, b)
        elif k[a] < k[c]:
            _swap(k, it, result, c)
        else:
            _swap(k, it, result, a)
    elif k[a] < k[c]:
        _swap(k, it, result, a)
    elif k[b] < k[c]:
        _swap(k, it, result, c)
    else:
        _swap(k, it, result, b)


def _unguarded_partition(k: list[Any], it: list[Any], first: int, last: int, pivot: int) -> int:
    while True:
        while k[first] < k[pivot]:
            first += 1
        last -= 1
        while k[pivot] < k[last]:
            last -= 1
        if not first < last:
            return first
        _swap(k, it, first, last)
        first += 1


def _final_insertion_sort(k: list[Any], it: list[Any], first: int, last: int) -> None:
    if last - first > _THRESHOLD:
        _insertion_sort(k, it, first, first + _THRESHOLD)
        for i in range(first + _THRESHOLD, last):
            _unguarded_linear_insert(k, it, i)
    else:
        _insertion_sort(k, it, first, last)


def _insertion_sort(k: list[Any], it: list[Any], first: int, last: int) -> None:
    for i in range(first + 1, last):
        if k[i] < k[first]:
            kv, iv = k[i], it[i]
            k[first + 1 : i + 1] = k[first:i]
            it[first + 1 : i + 1] = it[first:i]
            k[first], it[first] = kv, iv
        else:
            _unguarded_linear_insert(k, it, i)


def _unguarded_linear_insert(k: list[Any], it: list[Any], last: int) -> None:
    kv, iv = k[last], it[last]
    nxt = last - 1
    while kv < k[nxt]:
        k[last], it[last] = k[nxt], it[nxt]
        last = nxt
        nxt -= 1
    k[last], it[last] = kv, iv


# heap-sort fallback (depth limit reached) -------------------------------------------------


def _partial_sort(k: list[Any], it: list[Any], first: int, middle: int, last: int) -> None:
    _heap_select(k, it, first, middle, last)
    _sort_heap(k, it, first, middle)


def _heap_select(k: list[Any], it: list[Any], first: int, middle: int, last: int) -> None:
    _make_heap(k, it, first, middle)
    for i in range(middle, last):
        if k[i] < k[first]:
            _pop_heap(k, it, first, middle, i)


def _make_heap(k: list[Any], it: list[Any], first: int, last: int) -> None:
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        kv, iv = k[first + parent], it[first + parent]
        _adjust_heap(k, it, first, parent, length, kv, iv)
        if parent == 0:
            return
        parent -= 1


def _adjust_heap(k: list[Any], it: list[Any], first: int, hole: int, length: int, kv: Any, iv: Any) -> None:
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if k[first + second] < k[first + second - 1]:
            second -= 1
        k[first + hole], it[first + hole] = k[first + second], it[first + second]
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        k[first + hole], it[first + hole] = k[first + second - 1], it[first + second - 1]
        hole = second - 1
    parent = (hole - 1) // 2
    while hole > top and k[first + parent] < kv:
        k[first + hole], it[first + hole] = k[first + parent], it[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    k[first + hole], it[first + hole] = kv, iv


def _pop_heap(k: list[Any], it: list[Any], first: int, last: int, result: int) -> None:
    kv, iv = k[result], it[result]
    k[result], it[result] = k[first], it[first]
    _adjust_heap(k, it, first, 0, last - first, kv, iv)


def _sort_heap(k: list[Any], it: list[Any], first: int, last: int) -> None:
    while last - first > 1:
        last -= 1
        _pop_heap(k, it, first, last, last)
