"""The matcher's consistency check (tests and debugging): free + allocated == capacity
everywhere, and every job's state is exactly what its record says, over the matcher's state
read-only (``Matcher.check_invariants`` passes it in)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from fluxnetes.match.engine import Engine
from fluxnetes.match.placement import descendants
from fluxnetes.match.results import JobRecord
from fluxnetes.match.vstate import VState
from fluxnetes.plan import max_overlap


def check_invariants(eng: Engine, jobs: Mapping[int, JobRecord], reserved_ids: set[int],
                     ends_indexed: list[int], split_pools: bool) -> None:
    """free + allocated == capacity everywhere, and every job's state is exactly recorded."""
    problems: list[str] = []
    expect_plan: dict[VState, dict[int, int]] = {}
    expect_f: dict[VState, dict[int, dict[str, int]]] = {}
    expect_x: dict[VState, set[int]] = {}
    for jid, rec in jobs.items():
        for e in rec.entries:
            expect_x.setdefault(e.vs, set()).add(jid)
            if e.plan:
                expect_plan.setdefault(e.vs, {})[jid] = e.plan
                t = e.vs.v.type
                if eng.is_pruning_type(t):
                    cnt = e.plan if (split_pools and e.vs.v.size > 1 and not e.vs.children) else e.vs.v.size
                    p = e.vs.parent
                    while p is not None:
                        d = expect_f.setdefault(p, {}).setdefault(jid, {})
                        d[t] = d.get(t, 0) + cnt
                        p = p.parent
    reserved = {jid for jid, rec in jobs.items() if rec.reserved}
    if reserved != reserved_ids:
        problems.append(f"reservations indexed {sorted(reserved_ids)} != recorded {sorted(reserved)}")
    ends = sorted(rec.at + rec.duration for rec in jobs.values())
    if ends != ends_indexed:
        problems.append(f"job window ends indexed {ends_indexed[:5]}... != recorded {ends[:5]}...")
    for u in eng.vs.values():
        v = u.v
        ps = u.ps or {}
        got = {j: a for j, (_s, _e, a) in ps.items()}
        if got != expect_plan.get(u, {}):
            problems.append(f"{v.path}: planner spans {got} != job records {expect_plan.get(u, {})}")
        if u.pused != sum(got.values()):
            problems.append(f"{v.path}: used sum {u.pused} != {sum(got.values())}")
        allocs = sum(1 for j in got if not jobs[j].reserved) if all(j in jobs for j in got) else -1
        if allocs != u.alloc_n:
            problems.append(f"{v.path}: allocation count {u.alloc_n} != {allocs}")
        bounds = sorted({s for s, _e, _a in ps.values()} | {0})
        for tb in bounds:
            used = max_overlap(ps.values(), tb, tb + 1)
            if used > v.size:
                problems.append(f"{v.path}: {used} used > size {v.size} at t={tb}")
        xs = set(u.xs or ())
        if not u.children:
            xs |= set(ps.keys())
        if xs != expect_x.get(u, set()):
            problems.append(f"{v.path}: tags {sorted(xs)} != {sorted(expect_x.get(u, set()))}")
        if u.ftypes:
            want = expect_f.get(u, {})
            f = u.f
            fspans = cast("dict[int, tuple[int, int, tuple[int, ...]]]", dict(f or {}))
            if f is None or f.totals() != dict(zip(u.ftypes, u.ftot, strict=True)):
                problems.append(f"{v.path}: filter planner {f!r} != totals {u.ftot} of {u.ftypes}")
            have = {j: dict(zip(u.ftypes, c, strict=True)) for j, (_s, _e, c) in fspans.items()}
            for j in set(want) | set(have):
                w = {t: n for t, n in want.get(j, {}).items() if t in u.fidx and n}
                h = {t: n for t, n in have.get(j, {}).items() if n}
                if w != h:
                    problems.append(f"{v.path}: filter span of job {j} {h} != expected {w}")
            for i, t in enumerate(u.ftypes):
                s = sum(c[i] for (_s, _e, c) in fspans.values())
                if s != u.fused[i]:
                    problems.append(f"{v.path}: filter used[{t}] {u.fused[i]} != {s}")
                cap = sum(x.v.size for x in descendants(u) if x.v.type == t)
                if cap != u.ftot[i]:
                    problems.append(f"{v.path}: filter total[{t}] {u.ftot[i]} != capacity {cap}")
                fb = sorted({sp[0] for sp in fspans.values()} | {0})
                for tt in fb:
                    if u.f_avail(i, tt, tt + 1) < 0:
                        problems.append(f"{v.path}: {t} over-allocated at t={tt}")
        if len(problems) > 20:
            break
    if problems:
        raise AssertionError("matcher invariants violated:\n  " + "\n  ".join(problems[:20]))
