"""PNG plots of simulation runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path

from fluxnetes.sim.engine import SimRun

DAY = 86400


def _binned(run: SimRun, width: int) -> tuple[list[float], list[float], list[float]]:
    """Time-weighted mean queue length and utilization per bin of ``width`` seconds."""
    samples = run.samples
    if not samples:
        return [], [], []
    start = samples[0].time
    end = samples[-1].time
    nbins = max(1, (end - start) // width + 1)
    queue = [0.0] * nbins
    busy = [0.0] * nbins
    for cur, nxt in pairwise(samples):
        t = cur.time
        while t < nxt.time:
            b = (t - start) // width
            edge = min(nxt.time, start + (b + 1) * width)
            queue[b] += cur.queued * (edge - t)
            busy[b] += cur.busy_cores * (edge - t)
            t = edge
    xs = [(i * width) / DAY for i in range(nbins)]
    return xs, [q / width for q in queue], [b / (width * run.total_cores) for b in busy]


def write_plots(runs: Mapping[str, SimRun], directory: str | Path, title: str = "") -> list[Path]:
    """queue.png, utilization.png and wait_cdf.png in ``directory``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    span = max((r.samples[-1].time - r.samples[0].time for r in runs.values() if r.samples), default=DAY)
    width = DAY if span > 20 * DAY else max(60, span // 200)
    unit = "days" if width == DAY else f"days (bins of {width} s)"
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, run in runs.items():
        xs, queue, _ = _binned(run, width)
        ax.plot(xs, queue, label=name, linewidth=0.8)
    ax.set_xlabel(f"time since first submit ({unit})")
    ax.set_ylabel("jobs waiting (mean per bin)")
    ax.set_title(f"Queue length {title}".strip())
    ax.legend()
    fig.tight_layout()
    paths.append(out / "queue.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, run in runs.items():
        xs, _, util = _binned(run, width)
        ax.plot(xs, [u * 100 for u in util], label=name, linewidth=0.8)
    ax.set_xlabel(f"time since first submit ({unit})")
    ax.set_ylabel("cores busy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"Utilization {title}".strip())
    ax.legend()
    fig.tight_layout()
    paths.append(out / "utilization.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, run in runs.items():
        waits = sorted(o.start - o.job.submit for o in run.outcomes if o.start is not None)
        if not waits:
            continue
        n = len(waits)
        ax.step([max(w, 1) for w in waits], [(i + 1) / n for i in range(n)], where="post",
                label=name, linewidth=0.9)
    ax.set_xscale("log")
    ax.set_xlabel("wait time (s, log scale; 0 shown as 1)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.01)
    ax.set_title(f"Wait-time CDF {title}".strip())
    ax.legend()
    fig.tight_layout()
    paths.append(out / "wait_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
