"""The fair-share error: delivered core-seconds against shares among contending accounts."""

from __future__ import annotations

import pytest

from fluxnetes.sim.engine import JobOutcome, SimJob, SimRun
from fluxnetes.sim.sharefit import share_error


def _ran(job_id: str, submit: int, start: int, end: int, cores: int) -> JobOutcome:
    return JobOutcome(SimJob(job_id, submit, end - start, end - start, cores),
                      start=start, end=end, cores=cores)


def test_by_shares_is_zero_and_all_to_one_is_the_others_share() -> None:
    owners = {"a1": "a", "b1": "b", "a2": "a", "b2": "b"}
    shares = {"a": 0.75, "b": 0.25}
    # both wait from 0; a gets 3 cores, b 1 core, over the whole day: exactly by shares
    fair = SimRun([_ran("a1", 0, 10, 100, 3), _ran("b1", 0, 10, 100, 1)], [], 4)
    assert share_error(fair, owners, shares, width=100) == {
        "share_error": 0.0, "contended_bins": 1, "bins": 1}
    # a gets everything while b waits: b was due 25 %
    unfair = SimRun([_ran("a1", 0, 0, 100, 4), _ran("b1", 0, 100, 150, 4)], [], 4)
    result = share_error(unfair, owners, shares, width=100)
    assert result["share_error"] == pytest.approx(0.25 * 400 / 600 + 0.0 * 200 / 600)
    # nobody waited: nothing for fair share to decide
    idle = SimRun([_ran("a2", 0, 0, 50, 1), _ran("b2", 0, 0, 50, 1)], [], 4)
    assert share_error(idle, owners, shares, width=100)["contended_bins"] == 0


def test_an_account_wanting_less_than_its_share_leaves_the_rest_to_the_others() -> None:
    owners = {"a1": "a", "b1": "b", "c1": "c"}
    shares = {"a": 0.5, "b": 0.25, "c": 0.25}
    # a runs one core and waits for nothing; b and c wait and split the other 3 cores
    run = SimRun([_ran("a1", 0, 0, 100, 1), _ran("b1", 0, 10, 100, 2),
                  _ran("c1", 0, 10, 100, 1)], [], 4)
    # targets: a wants 100 (less than its half of 370), b and c share the 270 left
    # equally by weight: 135 each; they got 180 and 90
    result = share_error(run, owners, shares, width=100)
    assert result["share_error"] == pytest.approx(0.5 * (50 + 40) / 370)


def test_share_fit_has_the_windows_and_each_accounts_got_and_due() -> None:
    from fluxnetes.sim.sharefit import share_fit

    owners = {"a1": "a", "b1": "b"}
    shares = {"a": 0.75, "b": 0.25}
    # bin 0: a gets all 400 core-seconds while b waits (due 300 / 100); bin 1: b runs alone
    unfair = SimRun([_ran("a1", 0, 0, 100, 4), _ran("b1", 0, 100, 150, 4)], [], 4)
    fit = share_fit(unfair, owners, shares, width=100)
    assert fit.windows == [(0, pytest.approx(0.25), 400.0), (100, 0.0, 200.0)]
    assert fit.delivered == {"a": 400.0, "b": 200.0}
    assert fit.due == {"a": pytest.approx(300.0), "b": pytest.approx(300.0)}
    data = fit.as_dict()
    assert data["share_error"] == pytest.approx(0.25 * 400 / 600)
    assert data["share_accounts"]["b"] == {"delivered_core_seconds": 200.0,
                                           "due_core_seconds": pytest.approx(300.0)}


def test_simulate_shows_the_share_error_beside_jains_index(tmp_path: object) -> None:
    """`simulate --fairshare` prints and writes both measures, per run."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from fluxnetes.cli.main import app

    path = Path(str(tmp_path)) / "t.swf"
    lines = ["; MaxNodes: 2", "; MaxProcs: 2"]
    for i in range(12):  # user 1 floods the 2 processors, user 2 submits a little later
        user = 1 if i < 8 else 2
        lines.append(f"{i + 1} {i * 5} -1 100 1 -1 -1 1 100 -1 1 {user} 1 -1 1 -1 -1 -1")
    path.write_text("\n".join(lines) + "\n")
    cli = CliRunner()
    result = cli.invoke(app, ["simulate", str(path), "--fairshare", "users", "--compare", "easy",
                              "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for run in ("easy", "easy+fairshare"):
        fairness = data[run]["fairness"]
        assert 0 < fairness["jain_users_mean_bsld"] <= 1
        assert 0 <= fairness["share_error"] <= 1 and fairness["share_windows"]
        assert set(fairness["share_accounts"]) == {"user-1", "user-2"}
    result = cli.invoke(app, ["simulate", str(path), "--fairshare", "users", "--compare", "easy"],
                        env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "share error (contended days)" in result.stdout and "Jain index" in result.stdout
    assert "got / due" in result.stdout
