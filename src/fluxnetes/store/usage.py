"""Fair share's memory: decayed usage per account (table ``account_usage``).

The operator writes each leaf account's decayed usage as of a time (``save_usage``) every
so often and reads it back when it starts (``load_usage``), so fair share survives restarts
and leader changes. One row per account, upserted: the table never grows with the history.
Rows of accounts that left the configuration are kept (an account created again with the
same name gets its usage back, decayed); ``forget_usage`` drops them. Times are integers
(seconds) passed in by the caller, as everywhere in the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from fluxnetes.store.models import ACCOUNT_USAGE, AccountUsage

if TYPE_CHECKING:
    from fluxnetes.store.store import Store


@dataclass(frozen=True)
class UsageRecord:
    account: str
    usage: float  # decayed resource-seconds as of updated_time
    updated_time: int


def _upsert(store: Store, rows: list[dict[str, Any]]) -> Any:
    if store.engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        pg = pg_insert(ACCOUNT_USAGE).values(rows)
        return pg.on_conflict_do_update(
            index_elements=["account"],
            set_={"usage": pg.excluded.usage, "updated_time": pg.excluded.updated_time},
        )
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    lite = sqlite_insert(ACCOUNT_USAGE).values(rows)
    return lite.on_conflict_do_update(
        index_elements=["account"],
        set_={"usage": lite.excluded.usage, "updated_time": lite.excluded.updated_time},
    )


def save_usage(store: Store, values: Mapping[str, float], now: int) -> int:
    """Write each account's decayed usage as of ``now`` (one transaction). Returns the rows
    written. A value that is not a finite number >= 0 is refused, naming the account."""
    rows = []
    for account, value in sorted(values.items()):
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"account usage {account!r}: must be a finite number >= 0, got {value!r}")
        rows.append({"account": account, "usage": float(value), "updated_time": int(now)})
    if not rows:
        return 0
    with store.session() as s:
        s.execute(_upsert(store, rows))
    return len(rows)


def load_usage(store: Store) -> dict[str, UsageRecord]:
    """Every account's last saved usage."""
    with store.session(write=False) as s:
        rows = s.execute(select(AccountUsage.account, AccountUsage.usage, AccountUsage.updated_time)).all()
    return {r.account: UsageRecord(r.account, float(r.usage), int(r.updated_time)) for r in rows}


def forget_usage(store: Store, accounts: Iterable[str]) -> int:
    """Drop the rows of ``accounts`` (their usage is gone for good)."""
    names = list(accounts)
    if not names:
        return 0
    with store.session() as s:
        result = s.execute(delete(AccountUsage).where(AccountUsage.account.in_(names)))
    return int(getattr(result, "rowcount", 0) or 0)
