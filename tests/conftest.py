"""Shared pytest wiring: the `k8s` marker and the session-scoped `k8s_cluster` fixture; the
store fixtures (`store_url`, `store`, on SQLite and PostgreSQL) and `unfreeze_gc`.

Tests that need the local control plane either request `k8s_cluster` (they are then marked
`k8s` automatically) or carry `@pytest.mark.k8s`. When the binaries built by
hack/build-k8s.sh are missing they are skipped with the reason, unless
FLUXNETES_REQUIRE_K8S=1 (then they fail, so CI cannot pass without them silently).

The cluster starts lazily, once per test session, on the first test that requests it, in a
temporary directory (never the user's own `fluxnetes dev cluster`), and is stopped at the end.
Shape: 4 nodes (16 cpu, 64Gi, 4 nvidia.com/gpu) in 2 zones with 1 rack each
(nodes kwok-node-0..3; zone-0/rack-0 holds 0-1, zone-1/rack-1 holds 2-3).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fluxnetes.devcluster.paths import missing_message, toolchain
from test_store_helpers import fresh_pg_database, pg_url

if TYPE_CHECKING:
    from fluxnetes.devcluster import Cluster
    from fluxnetes.store import Store

K8S_FIXTURE = "k8s_cluster"

# The suite runs on pure Python: `fluxnetes simulate` (in-process or as a subprocess) would
# otherwise load the mypyc build when one matches (fluxnetes.native); tests/test_native.py
# asks for it explicitly. FLUXNETES_TEST_NATIVE=1 runs the tests on the native build instead
# (it must match these sources, else activate raises; loaded here, before any test module
# imports the engine: the imports above load none of its modules), e.g. tests/test_sim*.py,
# to check that the tests and the compiled classes agree.
_NATIVE_RUN = os.environ.get("FLUXNETES_TEST_NATIVE") == "1"
if _NATIVE_RUN:
    from fluxnetes import native

    os.environ[native.ENV_SWITCH] = "1"
    print(f"FLUXNETES_TEST_NATIVE=1: {native.activate().describe()}")
else:
    os.environ["FLUXNETES_NATIVE"] = "0"


def k8s_missing_reason() -> str | None:
    """Why `k8s` tests cannot run here, or None when the binaries are in place."""
    missing = toolchain().missing()
    return missing_message(missing) if missing else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    k8s_items = []
    for item in items:
        if K8S_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)
        if item.get_closest_marker("k8s") is not None:
            k8s_items.append(item)
    reason = k8s_missing_reason() if k8s_items else None
    if reason and os.environ.get("FLUXNETES_REQUIRE_K8S") != "1":
        for item in k8s_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running dev cluster (see the module docstring for its nodes), shared by the session."""
    from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape

    reason = k8s_missing_reason()
    if reason and os.environ.get("FLUXNETES_REQUIRE_K8S") == "1":
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    cluster = Cluster.up(
        ClusterOptions(
            nodes=NodeShape(count=4, cpu="16", memory="64Gi", gpus=4, zones=2, racks=1),
            dir=tmp_path_factory.mktemp("devcluster"),
            die_with_parent=True,
        )
    )
    try:
        yield cluster
    finally:
        cluster.down()


# -- the store, on each backend ----------------------------------------------------------------

_STORE_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgresql",
        id="postgresql",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(pg_url() is None, reason="FLUXNETES_TEST_PG_URL is not set"),
        ],
    ),
]


@pytest.fixture(params=_STORE_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new empty store database: a SQLite file, then a fresh PostgreSQL database (dropped
    afterwards) when FLUXNETES_TEST_PG_URL is set."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield from fresh_pg_database()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open Store (schema created) on `store_url`, closed afterwards."""
    from fluxnetes.store import Store

    s = Store.open(store_url)
    yield s
    s.close()


@pytest.fixture
def unfreeze_gc() -> Iterator[None]:
    """The queue service freezes the collector's view (gc.freeze) for speed; give the rest of
    the test session a normal collector back (`pytestmark = pytest.mark.usefixtures(...)`)."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _no_accounting_check_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process controllers run their post-restart accounting check at once: the tests await
    every task the controller spawned, and the production delay (recovery.py) would only make
    them wait (operators started as processes keep it)."""
    monkeypatch.setattr("fluxnetes.k8s.persistence.recovery.ACCOUNTING_CHECK_DELAY", 0.0)
