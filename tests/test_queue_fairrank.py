"""queue/fairrank.py: the factors of a few leaves of a flat tree, without reading every leaf,
must be the very floats fairshare.leaf_factors gives (and the queue order the same)."""

from __future__ import annotations

import random

import pytest

from fluxnetes.queue.accounts import AccountTree
from fluxnetes.queue.fairrank import FlatRanker, is_flat
from fluxnetes.queue.fairshare import leaf_factors
from fluxnetes.queue.priority import FairShare, FairShareConfig
from fluxnetes.queue.usage import Resources, Usage


def _tree(rng: random.Random, n: int, equal: bool) -> AccountTree:
    if equal:
        return AccountTree.flat([f"u{i}" for i in range(n)])
    return AccountTree.from_dict({"accounts": {f"u{i}": {"shares": rng.randint(1, 5)} for i in range(n)}})


@pytest.mark.parametrize("algorithm", ["fair_tree", "classic"])
@pytest.mark.parametrize("seed", range(12))
def test_ranker_gives_leaf_factors_floats(algorithm: str, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 30])
    tree = _tree(rng, n, equal=seed % 2 == 0)
    half_life = rng.choice([0, 600, 86400])
    usage = Usage(tree, half_life)
    ranker = FlatRanker(tree, usage, algorithm)  # type: ignore[arg-type]
    running: dict[str, str] = {}
    now = 0
    checked = 0
    for step in range(400):
        now += rng.choice([0, 0, 1, 7, 300, 5000])
        if running and rng.random() < 0.45:
            job = rng.choice(sorted(running))
            usage.end(job, now)
            del running[job]
        else:
            leaf = f"u{rng.randrange(n)}"
            # identical jobs make exactly tied usage: the fallback's case
            cores = rng.choice([1, 1, 4]) if seed % 3 else 1
            usage.start(f"j{step}", leaf, Resources(cores=cores), now)
            running[f"j{step}"] = leaf
        full = leaf_factors(algorithm, tree, usage.totals(now))  # type: ignore[arg-type]
        some = rng.sample(tree.leaves, rng.randint(1, n))
        got = ranker.factors(some, now)
        if got is None:
            continue  # a near tie: the caller computes every leaf
        checked += 1
        assert got == {leaf: full[leaf] for leaf in some}, (step, now)
    assert checked >= 50
    if algorithm == "classic":
        assert ranker.fallbacks == 0


def test_equal_usage_falls_back_and_flat_trees_only() -> None:
    tree = AccountTree.flat(["a", "b", "c"])
    usage = Usage(tree, 3600)
    ranker = FlatRanker(tree, usage, "fair_tree")
    for leaf in ("a", "b"):  # the same job at the same time: equal usage, a tie
        usage.start(leaf, leaf, Resources(cores=2), 0)
        usage.end(leaf, 100)
    assert ranker.factors(["a"], 200) is None and ranker.fallbacks == 1
    assert ranker.factors(["c"], 200) == {"c": 1.0}  # no usage: the top
    assert not is_flat(AccountTree.from_dict({"accounts": {"x": {}, "y": {"parent": "x"}}}))
    with pytest.raises(ValueError, match="not flat"):
        FlatRanker(AccountTree.from_dict({"accounts": {"x": {}, "y": {"parent": "x"}}}),
                   usage, "fair_tree")


class _Job:
    def __init__(self, i: int, account: str, cores: int) -> None:
        self.id, self.account, self.submit_time, self.priority = str(i), account, i, 0
        self.min_cores, self.jobspec = cores, None


@pytest.mark.parametrize("algorithm", ["fair_tree", "classic"])
def test_order_on_a_flat_tree_is_the_full_computations(algorithm: str) -> None:
    """FairShare.order asks the ranker for the queued accounts only; the order is the one
    every leaf's factors (fairshare.leaf_factors) give."""
    rng = random.Random(5)
    tree = AccountTree.flat([f"u{i}" for i in range(40)])
    config = FairShareConfig(algorithm=algorithm, half_life=3600, total_cores=64)  # type: ignore[arg-type]
    fs = FairShare(tree, config)
    queue = [_Job(i, f"u{rng.randrange(40)}", rng.choice([1, 2, 8])) for i in range(60)]
    now = 0
    for step in range(150):
        now += rng.choice([1, 60, 900])
        job = queue[step % len(queue)]
        fs.usage.start(f"r{step}", job.account, Resources(cores=job.min_cores), now)
        if step % 3:
            fs.usage.end(f"r{step}", now + rng.choice([0, 30]))
        waiting = rng.sample(queue, 12)
        got = fs.order(waiting, now)
        factors = leaf_factors(algorithm, tree, fs.usage.totals(now))  # type: ignore[arg-type]
        want = sorted(waiting, key=lambda j: (-(1000 * min(now - j.submit_time, 7 * 86400) / (7 * 86400)
                                                + 10000 * factors[j.account] + 1000 * j.min_cores / 64),
                                              j.submit_time, int(j.id)))
        assert [j.id for j in got] == [j.id for j in want]
    assert fs._ranker is not None and fs._ranker.answered > 0


def test_order_reads_only_the_queued_accounts_usage() -> None:
    """The cost of a cycle's order follows the queued accounts, not the tree: with 2,000
    flat accounts and usage moving every cycle, no cycle reads every account's usage."""
    tree = AccountTree.flat([f"u{i}" for i in range(2000)])
    fs = FairShare(tree, FairShareConfig(half_life=3600, total_cores=100))
    for i in range(50):
        fs.usage.start(f"h{i}", f"u{i * 37 % 2000}", Resources(cores=1 + i % 4), i * 10)
        if i % 2:
            fs.usage.end(f"h{i}", i * 10 + 5)
    queue = [_Job(i, f"u{i * 11 % 2000}", 1) for i in range(5)]
    for cycle in range(20):
        fs.usage.start(f"c{cycle}", "u3", Resources(cores=1), 1000 + cycle)  # usage moves
        fs.order(queue, 1000 + cycle)
    assert fs.usage.node_reads == 0  # totals() (every account) was never needed
    assert fs._ranker is not None and fs._ranker.answered == 20
