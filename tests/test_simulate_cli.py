"""`fluxnetes simulate --store URL`: a simulated run is recorded in the store."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fluxnetes.cli.main import app
from fluxnetes.store import JobState, Store


def test_simulate_records_every_job_in_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    result = CliRunner().invoke(app, ["simulate", "--limit", "200", "--compare", "fcfs,easy",
                                      "--store", url])
    assert result.exit_code == 0, result.output
    assert "recorded 200 jobs in the store" in result.output
    store = Store.open(url)
    try:
        counts = store.counts()
        # both policies' runs are recorded, each job exactly once per run, all completed
        assert counts[JobState.COMPLETED] == 400
        assert sum(counts.values()) == 400
    finally:
        store.close()


def test_simulate_with_a_bad_store_url_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["simulate", "--limit", "10", "--store", "mysql://x/y"])
    assert result.exit_code != 0
    assert "--store" in result.output
    assert "Traceback" not in result.output


def test_simulate_creates_output_folders_and_reports_unwritable_ones(tmp_path: Path) -> None:
    csv = tmp_path / "new" / "deeper" / "jobs.csv"
    result = CliRunner().invoke(app, ["simulate", "--limit", "20", "--csv", str(csv)])
    assert result.exit_code == 0, result.output
    assert csv.read_text().count("\n") >= 20
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["simulate", "--limit", "20", "--csv", str(blocker / "x.csv")])
    assert result.exit_code != 0
    assert "--csv" in result.output and "Traceback" not in result.output
