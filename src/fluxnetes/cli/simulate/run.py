"""`fluxnetes simulate`: running the plan (every run with a progress bar on stderr, optionally
recorded in a store)."""

from __future__ import annotations

from typing import Any

from fluxnetes.cli.simulate.options import RunPlan, SimulateArgs, usage_error


def run_plan(opts: SimulateArgs, plan: RunPlan, err: Any, out: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every run of the plan; returns (label -> sim run, label -> its summary)."""
    store = opts.store
    recorder = _open_recorder(store) if store is not None else None
    try:
        runs, summaries = _run_all(plan.workload, plan.runs, opts.match_policy, quiet=opts.as_json,
                                   console=err, recorder=recorder, engine=opts.engine)
    finally:
        if recorder is not None:
            recorder.close()
            recorder.store.close()
    if recorder is not None and not opts.as_json:
        out.print(f"recorded {len(recorder.ids):,} jobs in the store ({store})", markup=False)
    return runs, summaries


def _open_recorder(url: str) -> Any:
    """A store observer for the simulation; with --compare every policy's run is recorded in
    its own namespace (``sim-<policy>``)."""
    from fluxnetes.store import Store
    from fluxnetes.store.recorder import StoreRecorder

    try:
        opened = Store.open(url)
    except Exception as exc:  # a bad URL or an unreachable database: say which, no traceback
        raise usage_error(f"--store {url}: {exc}") from None
    return StoreRecorder(opened)


def _run_all(workload: Any, plan: list[tuple[str, Any, Any]], match_policy: str, *, quiet: bool,
             console: Any, recorder: Any = None,
             engine: str = "queue") -> tuple[dict[str, Any], dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fluxnetes.sim.runner import run_policy

    runs: dict[str, Any] = {}
    summaries: dict[str, Any] = {}
    total = len(workload.jobs)
    show = not quiet and console.is_terminal
    with Progress(TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs"), TimeElapsedColumn(), console=console, disable=not show,
                  transient=False) as progress:
        for label, policy, fairshare in plan:
            task = progress.add_task(label, total=total)

            def advance(done: int, task: Any = task) -> None:
                progress.update(task, completed=done)

            if recorder is not None:
                recorder.flush()
                recorder.namespace = f"sim-{label.replace(':', '-').replace('+', '-')}"
                recorder.ids.clear()
            run, summary = run_policy(workload, policy, match_policy=match_policy, progress=advance,
                                      observer=recorder, engine=engine,  # type: ignore[arg-type]
                                      fairshare=fairshare)
            runs[label] = run
            summaries[label] = summary
    return runs, summaries
