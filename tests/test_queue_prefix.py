"""``Scheduler._prefix``: how many jobs of the last walk (those still pending) lead the
queue in the same order. Its one-pass form (no set of the whole queue) must answer what
the definition answers, for any queue: jobs left, arrived, reordered."""

from __future__ import annotations

import copy
import random

import pytest

from fluxnetes.match import Matcher
from fluxnetes.queue import QueuedJob, QueuePolicy, Scheduler
from fluxnetes.queue.walk import _Walk
from fluxnetes.sim.machine import machine_from_size


def _definition(walked: list[str], order: list[str]) -> int | None:
    pending = set(order)
    still = [job_id for job_id in walked if job_id in pending]
    return len(still) if order[:len(still)] == still else None


def _scheduler() -> Scheduler:
    machine = machine_from_size(2, 1)
    return Scheduler(Matcher(copy.deepcopy(machine.graph), policy="first"),
                     QueuePolicy.parse("easy", queue_depth=None, reservation_style="counted"),
                     capacity_cores=machine.total_cores, incremental=True)


@pytest.mark.parametrize("seed", range(6))
def test_prefix_answers_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    sched = _scheduler()
    jobs = {f"j{i}": QueuedJob(id=f"j{i}", jobspec=None, submit_time=i, min_cores=1)
            for i in range(40)}
    names = list(jobs)
    seen = {True: 0, False: 0}  # answers that are a number / None: both kinds are tried
    for _ in range(300):
        walked = rng.sample(names, rng.randint(0, 12))
        order = [job_id for job_id in walked if rng.random() < 0.7]  # some left
        if rng.random() < 0.3 and len(order) > 1:  # reordered
            a, b = rng.sample(range(len(order)), 2)
            order[a], order[b] = order[b], order[a]
        order += [job_id for job_id in rng.sample(names, rng.randint(0, 8))
                  if job_id not in order]  # arrived (or walked and pending, behind)
        sched._walk = _Walk(order=list(walked))
        sched._reset = False
        want = _definition(walked, order)
        assert sched._prefix([jobs[job_id] for job_id in order]) == want, (walked, order)
        seen[want is not None] += 1
    assert seen[True] and seen[False]


def test_prefix_is_none_before_a_walk_and_after_a_reset() -> None:
    sched = _scheduler()
    assert sched._prefix([]) is None
    sched._walk = _Walk(order=[])
    sched._reset = True
    assert sched._prefix([]) is None
