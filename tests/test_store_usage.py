"""Fair share's usage in the store (table account_usage, migration 0002), on SQLite and on the
real PostgreSQL (FLUXNETES_TEST_PG_URL; `source hack/lib.sh; pg_start`): save, load, upsert,
forget, and the operator's FairShareBook surviving a restart through it."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from fluxnetes.k8s.fairshare.fairshare_book import FairShareBook
from fluxnetes.queue.job import QueuedJob
from fluxnetes.queue.priority import FairShareConfig
from fluxnetes.store import Store
from fluxnetes.store.usage import UsageRecord, forget_usage, load_usage, save_usage

HOUR = 3600


@dataclass
class Spec:
    totals: dict[str, int] = field(default_factory=dict)


def job(job_id: str, cores: int) -> QueuedJob:
    return QueuedJob(id=job_id, jobspec=Spec({"core": cores}), submit_time=0)


def accounts() -> list[dict[str, Any]]:
    return [{"metadata": {"name": "a"}, "spec": {"shares": 2}},
            {"metadata": {"name": "b"}, "spec": {"shares": 1}}]


def namespaces() -> list[dict[str, Any]]:
    return [{"metadata": {"name": "ns-a", "labels": {"fluxnetes.io/account": "a"}}},
            {"metadata": {"name": "ns-b", "labels": {"fluxnetes.io/account": "b"}}}]


def test_the_migration_is_the_head_and_creates_the_table(store: Store) -> None:
    from sqlalchemy import inspect

    from fluxnetes.store.db import current_revision, head_revision

    assert head_revision() == current_revision(store.engine) == "0002"
    cols = {c["name"] for c in inspect(store.engine).get_columns("account_usage")}
    assert cols == {"account", "usage", "updated_time"}


def test_save_load_upsert_and_forget(store: Store) -> None:
    assert load_usage(store) == {}
    assert save_usage(store, {"a": 10.5, "b": 0.0}, now=100) == 2
    assert load_usage(store) == {"a": UsageRecord("a", 10.5, 100), "b": UsageRecord("b", 0.0, 100)}
    # a second save replaces the rows (one row per account, whatever the history)
    save_usage(store, {"a": 7.25}, now=200)
    assert load_usage(store) == {"a": UsageRecord("a", 7.25, 200), "b": UsageRecord("b", 0.0, 100)}
    assert save_usage(store, {}, now=300) == 0
    assert forget_usage(store, ["b", "unknown"]) == 1
    assert set(load_usage(store)) == {"a"}
    assert forget_usage(store, []) == 0


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_bad_usage_is_refused_naming_the_account(store: Store, bad: float) -> None:
    with pytest.raises(ValueError, match=r"account usage 'a': must be a finite number >= 0"):
        save_usage(store, {"b": 1.0, "a": bad}, now=1)
    assert load_usage(store) == {}  # nothing written


def test_usage_survives_an_operator_restart(store_url: str) -> None:
    config = FairShareConfig(half_life=HOUR)
    # the first operator: a ran 8 cores for an hour, b 1 core; saved at 1 h
    store = Store.open(store_url)
    first = FairShareBook(config, store=store)
    first.configure(accounts(), namespaces(), 0)
    first.record_start(job("ns-a/x", 8), 0)
    first.record_start(job("ns-b/y", 1), 0)
    first.record_end("ns-a/x", HOUR)
    assert first.save(HOUR) == 0  # never loaded: it must not overwrite what is saved
    assert first.load(0) == 0
    assert asyncio.run(first.save_async(HOUR)) == 3  # a, b and the implicit default account
    store.close()
    expected = {r.name: r.usage for r in first.snapshot(2 * HOUR)}

    # the next one, an hour later, reads it back and records b's job again from now on:
    # usage is the same as if it had never stopped, except what b ran between save and restart
    store = Store.open(store_url)
    second = FairShareBook(config, store=store, now=2 * HOUR)
    second.configure(accounts(), namespaces(), 2 * HOUR)
    assert second.load(2 * HOUR) == 3
    second.record_start(job("ns-b/y", 1), 2 * HOUR)
    got = {r.name: r.usage for r in second.snapshot(2 * HOUR)}
    assert got["a"] == pytest.approx(expected["a"], rel=1e-9)
    ran_b = 1 * HOUR / math.log(2) * (1 - 0.5)  # b's hour between the save and the restart
    assert got["b"] == pytest.approx(expected["b"] - ran_b, rel=1e-9)
    assert got["a"] > 0 and got["b"] > 0
    # the fair-share factors follow: a used far more than its 2/3
    rows = {r.name: r for r in second.snapshot(2 * HOUR)}
    assert rows["b"].factor > rows["a"].factor
    store.close()


def test_usage_of_an_account_configured_later_is_applied_when_it_appears(store: Store) -> None:
    save_usage(store, {"a": 100.0, "late": 50.0}, now=0)
    book = FairShareBook(FairShareConfig(half_life=0), store=store)
    book.configure(accounts(), namespaces(), 0)
    assert book.load(0) == 1  # "late" is not an account yet
    book.configure([*accounts(), {"metadata": {"name": "late"}, "spec": {}}], namespaces(), 10)
    usage = {r.name: r.usage for r in book.snapshot(10)}
    assert usage["a"] == pytest.approx(100.0) and usage["late"] == pytest.approx(50.0)


def test_a_book_without_a_store_saves_nothing() -> None:
    book = FairShareBook()
    assert book.save(5) == 0 and book.load(5) == 0
