"""Crash recovery: a worker streaming submissions and cycles is SIGKILLed at random points;
afterwards every job is present exactly once, recorded resources == resources in use, and
scheduling continues. Also two workers writing at once. SQLite and PostgreSQL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluxnetes.queue.policy import QueuePolicy
from fluxnetes.store import JobState, Store
from fluxnetes.store.service import QueueService
from test_store_helpers import check_store, make_matcher

WORKER = str(Path(__file__).with_name("test_store_helpers.py"))
NODES, CORES, TOTAL, BATCH = 4, 4, 200, 5


pytestmark = pytest.mark.usefixtures("unfreeze_gc")


def worker(url: str, seed: int, step: bool = False, total: int = TOTAL) -> subprocess.Popen[bytes]:
    """The stream worker; with ``step`` it waits for a go-ahead line on stdin after each round."""
    args = [url, NODES, CORES, total, BATCH, seed, *(["step"] if step else [])]
    return subprocess.Popen(
        [sys.executable, WORKER, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(store: Store) -> None:
    """Keep scheduling (completing whatever runs) until the queue is empty."""
    t = max(j.updated_time for j in store.jobs()) + 1
    svc = QueueService(
        store,
        lambda: make_matcher(NODES, CORES),
        clock=lambda: t,
        policy=QueuePolicy(name="easy", queue_depth=16),
    )
    for _ in range(2 * TOTAL):
        svc.run_cycle()
        counts = store.counts()
        if counts[JobState.PENDING] + counts[JobState.RESERVED] + counts[JobState.RUNNING] == 0:
            return
        for job in store.jobs([JobState.RUNNING]):
            store.transition(job.id, JobState.COMPLETED, t, "finished")
        t += 1
    raise AssertionError(f"the queue did not drain: {store.counts()}")


def kill_and_check(p: subprocess.Popen[bytes], store_url: str) -> None:
    """SIGKILL the worker (it waits inside its stream) and check the store it left."""
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    store = Store(store_url)
    check_store(store, NODES, CORES)
    store.close()


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing_and_starts_nothing_twice(store_url: str) -> None:
    rng = random.Random(os.getpid())
    Store.open(store_url).close()  # schema first: the kills target the submission stream
    rounds = -(-TOTAL // BATCH)
    for round_ in range(5):
        p = worker(store_url, seed=round_, step=True)
        assert p.stdout is not None and p.stdin is not None
        for _ in range(rng.randint(1, rounds - 2)):  # let it get somewhere in the stream...
            assert p.stdout.readline().startswith(b"round")
            p.stdin.write(b"go\n")
            p.stdin.flush()
        # ...then kill it at a random point of the round it was let into. It cannot finish
        # the stream first on a slow machine: it waits for a go-ahead that never comes.
        time.sleep(rng.uniform(0, 0.03))
        kill_and_check(p, store_url)
    p = worker(store_url, seed=99)  # runs to the end: resubmits everything, idempotently
    _out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    store = Store(store_url)
    check_store(store, NODES, CORES)
    names = sorted(j.name for j in store.jobs())
    assert names == sorted(f"job{i}" for i in range(TOTAL))  # every job exactly once
    finish(store)
    check_store(store, NODES, CORES)
    counts = store.counts()
    assert counts[JobState.COMPLETED] + counts[JobState.UNSATISFIABLE] == TOTAL
    store.close()


@pytest.mark.slow
def test_a_kill_that_comes_late_still_finds_the_worker_inside_the_stream(store_url: str) -> None:
    """On a loaded machine the test's kill can come long after the go-ahead (the flake of
    issue #29 item 9: the worker had finished, `0 == -SIGKILL`). A stepped worker waits."""
    Store.open(store_url).close()
    p = worker(store_url, seed=7, step=True, total=4 * BATCH)  # a short stream: four rounds
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().startswith(b"round 0")
    p.stdin.write(b"go\n")
    p.stdin.flush()
    with pytest.raises(subprocess.TimeoutExpired):  # the rest of the stream takes < 1 s
        p.wait(timeout=5)
    kill_and_check(p, store_url)


@pytest.mark.slow
def test_two_processes_writing_at_once_do_not_corrupt_the_queue(store_url: str) -> None:
    Store.open(store_url).close()
    procs = [worker(store_url, seed=s) for s in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    store = Store(store_url)
    check_store(store, NODES, CORES)
    assert len(store.jobs()) == TOTAL  # both submitted every job; each exists once
    finish(store)
    check_store(store, NODES, CORES)
    store.close()
