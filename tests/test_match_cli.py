"""`fluxnetes match` sessions (stdin / --commands) and formats."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
EX = REPO / "examples"


def _app() -> typer.Typer:
    from fluxnetes.cli import match_cmd

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    match_cmd.register(app)
    return app


def test_commands_file_demo_runs() -> None:
    res = CliRunner().invoke(_app(), ["match", "--graph", str(EX / "graphs" / "demo.yaml"),
                                      "--commands", str(EX / "jobspecs" / "demo.commands")])
    assert res.exit_code == 0, res.output
    assert "INFO: JOBID=1 RESOURCES=ALLOCATED SCHEDULED AT=Now" in res.output
    assert "RESOURCES=RESERVED SCHEDULED AT=600" in res.output
    assert "UNSATISFIABLE: needs 128 core" in res.output
    assert "now = 600" in res.output and "cancelled job 1" in res.output


def test_stdin_session_keeps_going_after_errors(tmp_path: Path) -> None:
    spec = (EX / "jobspecs" / "slot1_core1.yaml").read_text()
    (tmp_path / "a.yaml").write_text(spec)
    (tmp_path / "bad.yaml").write_text("version: 9999\nresources: []\ntasks: []\n")
    script = "\n".join([
        f"match allocate {tmp_path / 'a.yaml'}",
        f"match allocate {tmp_path / 'bad.yaml'}",
        f"match allocate {tmp_path / 'missing.yaml'}",
        "cancel 77",
        "frobnicate",
        "set-status node0 sideways",
        f"match allocate {tmp_path / 'a.yaml'}",
        "info 2",
        "quit",
        "match allocate never-reached.yaml",
    ]) + "\n"
    res = CliRunner().invoke(_app(), ["match", "--graph", str(EX / "graphs" / "demo.json"), "--format", "rv1"],
                             input=script)
    assert res.exit_code == 2  # some commands failed, the session went on
    out = res.output
    assert "resources: must be a non-empty list" in out
    assert "cannot read" in out and "job 77 not found" in out and "unknown command 'frobnicate'" in out
    rv1 = [json.loads(line) for line in out.splitlines() if line.startswith("{\"version\"")]
    assert len(rv1) == 2 and rv1[0]["execution"]["R_lite"]
    assert "\"jobid\": 2" in out and "never-reached" not in out


def test_jgf_format_and_default_graph() -> None:
    res = CliRunner().invoke(_app(), ["match", "--format", "jgf", "--policy", "low"],
                             input=f"match allocate {EX / 'jobspecs' / 'slot1_core1.yaml'}\n")
    assert res.exit_code == 0, res.output
    first = next(line for line in res.output.splitlines() if line.startswith("{"))
    assert json.loads(first)["graph"]["nodes"][0]["metadata"]["type"] == "core"
    bad = CliRunner().invoke(_app(), ["match", "--policy", "best"], input="quit\n")
    assert bad.exit_code == 1 and "unknown policy" in bad.output
    bad = CliRunner().invoke(_app(), ["match", "--graph", "nope.txt"], input="quit\n")
    assert bad.exit_code == 1 and "unknown graph file type" in bad.output


def test_bundled_demo_runs_from_package_data() -> None:
    res = CliRunner().invoke(_app(), ["match", "--demo"])
    assert res.exit_code == 0, res.output
    assert "RESOURCES=RESERVED SCHEDULED AT=600" in res.output
