"""Fairness as fair share defines it: who got the machine, against their shares, over time.

Fair share does not promise equal slowdowns; it promises that, among the accounts that want
the machine, each gets core-seconds in proportion to its share. So, per time bin (a day by
default):

* the *contending* accounts are those with a job waiting or running in the bin; one with
  no job waiting got all it asked for, so its demand is what it got; one with a job
  waiting could have used any amount;
* an account's *target* is the weighted max-min fair division of the core-seconds
  delivered in the bin among the contending accounts, weighted by their normalized shares
  (water-filling: an account that wants less than its share gets what it wants, the rest
  is shared among the others by their shares, as fair share's usage-based order intends);
* its *delivered* share is its part of the core-seconds delivered in the bin;
* the bin's *share error* is the total variation distance between the two:
  ``0.5 * sum |delivered - target|`` (0: exactly by shares; 1: all to accounts that were
  due nothing).

Only bins in which some job waited count (otherwise every account got all it asked for and
fair share had nothing to decide); the run's figure is their mean weighted by the
core-seconds delivered in each. Jain's index over the users' mean bounded slowdown (kept
beside it) measures something else: a user with one short job that waited behind a busy
machine weighs as much as one that ran thousands, so the two can move apart (see
``sim/README.md``, "Fair share").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.sim.engine import SimRun

DAY = 86_400


def share_error(run: SimRun, account_of: Mapping[str, str], shares: Mapping[str, float], *,
                width: int = DAY) -> dict[str, float]:
    """``{"share_error": mean TV distance over contended bins, "contended_bins": n,
    "bins": m}``; ``account_of``: job id -> account; ``shares``: account -> its normalized
    share (accounts without one count as share 0)."""
    fit = share_fit(run, account_of, shares, width=width)
    return {"share_error": fit.error, "contended_bins": len(fit.windows), "bins": fit.bins}


@dataclass
class ShareFit:
    """Delivered core-seconds against the fair division, per contended bin and per account.

    ``windows``: one ``(bin start, share error, core-seconds delivered)`` per contended bin,
    in time order; ``delivered`` / ``due``: per account, the core-seconds it got and the
    core-seconds the fair division gave it, summed over the contended bins (``delivered /
    due`` above 1: it got more than its entitlement while others waited)."""

    error: float
    bins: int
    windows: list[tuple[int, float, float]] = field(default_factory=list)
    delivered: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"share_error": self.error, "contended_bins": len(self.windows), "bins": self.bins,
                "share_windows": [{"start": t, "share_error": e, "core_seconds": c}
                                  for t, e, c in self.windows],
                "share_accounts": {a: {"delivered_core_seconds": self.delivered[a],
                                       "due_core_seconds": self.due.get(a, 0.0)}
                                   for a in sorted(self.delivered)}}  # (due: the same keys)


def share_fit(run: SimRun, account_of: Mapping[str, str], shares: Mapping[str, float], *,
              width: int = DAY) -> ShareFit:
    """The share error (module docstring) with its windows and per-account sums."""
    ran = [o for o in run.outcomes if o.start is not None and o.end is not None]
    if not ran:
        return ShareFit(0.0, 0)
    t0 = min(o.job.submit for o in ran)
    delivered: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wanting: dict[int, set[str]] = defaultdict(set)
    waited: set[int] = set()
    hungry: dict[int, set[str]] = defaultdict(set)  # accounts with a job waiting in the bin
    last = 0
    for o in ran:
        assert o.start is not None and o.end is not None
        account = account_of[o.job.id]
        first_bin = (o.job.submit - t0) // width
        start_bin = (o.start - t0) // width
        end_bin = (max(o.end - 1, o.start) - t0) // width
        last = max(last, end_bin)
        for b in range(first_bin, end_bin + 1):
            wanting[b].add(account)
        if o.start > o.job.submit:
            waited.update(range(first_bin, start_bin + 1))
            for b in range(first_bin, start_bin + 1):
                hungry[b].add(account)
        t = o.start
        while t < o.end:
            b = (t - t0) // width
            edge = min(o.end, t0 + (b + 1) * width)
            delivered[b][account] += o.cores * (edge - t)
            t = edge
    total_weight = 0.0
    weighted = 0.0
    fit = ShareFit(0.0, last + 1)
    for b in sorted(waited):
        got = delivered.get(b)
        used = sum(got.values()) if got else 0.0
        if not used:
            continue
        assert got is not None
        # sorted: a set's order follows string hashing (PYTHONHASHSEED), and the float sums
        # below (the error, the water-filling levels) must add in the same order every run
        accounts = sorted(wanting[b] | got.keys())
        target = _water_fill(used, {a: shares.get(a, 0.0) for a in accounts},
                             {a: got.get(a, 0.0) for a in accounts if a not in hungry[b]})
        error = 0.0
        for account in accounts:
            mine = got.get(account, 0.0)
            due = target.get(account, 0.0)
            error += abs(mine - due) / used
            fit.delivered[account] = fit.delivered.get(account, 0.0) + mine
            fit.due[account] = fit.due.get(account, 0.0) + due
        weighted += 0.5 * error * used
        total_weight += used
        fit.windows.append((t0 + b * width, 0.5 * error, used))
    fit.error = weighted / total_weight if total_weight else 0.0
    return fit


def _water_fill(total: float, weight: Mapping[str, float],
                capped: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair division of ``total``: ``capped`` accounts want at most their
    value, the others any amount; each gets ``min(want, level * weight)`` for the level at
    which the whole is given out (accounts of weight 0 get only what a surplus leaves)."""
    out: dict[str, float] = {}
    left = total
    open_ = {a: w for a, w in weight.items() if w > 0}
    # capped accounts in the order they saturate (want per unit of weight)
    # (ties by name, so the order never rests on how the caller built its mappings)
    order = sorted((a for a in capped if a in open_), key=lambda a: (capped[a] / open_[a], a))
    for account in order:
        level = left / sum(open_.values())
        if capped[account] > level * open_[account]:
            break
        out[account] = capped[account]
        left -= capped[account]
        del open_[account]
    if open_:
        level = left / sum(open_.values())
        for account, w in open_.items():
            out[account] = level * w
    else:  # every weighted account is satisfied: the rest went to weightless ones
        for account in weight:
            if account not in out:
                out[account] = capped.get(account, 0.0)
    return out
