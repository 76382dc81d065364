"""The real Fluxion's answers (shared/data/fluxion-conformance) reproduced exactly via --replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fluxnetes.match.session import replay_cases
from helpers import cli_app

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CASES = SHARED / "data" / "fluxion-conformance" / "cases.json"
# firstnodex, locality and variation (with set-property steps), same format
MORE = CASES.with_name("cases_more_policies.json")

pytestmark = pytest.mark.skipif(
    not CASES.exists(),
    reason=f"conformance data not found at {CASES} (expected ../shared next to the repo)",
)


def test_replay_all_sessions_match_exactly() -> None:
    rep = replay_cases(CASES)
    sessions = json.loads(CASES.read_text())
    assert rep.sessions == len(sessions) == 168
    assert rep.steps == sum(
        1 for s in sessions for st in s["steps"] if st["cmd"].startswith("match")
    )
    assert rep.mismatched == 0, "\n".join(rep.messages[:5])
    assert rep.ok


@pytest.mark.skipif(not MORE.exists(), reason=f"{MORE} not found")
def test_replay_more_policies_match_exactly() -> None:
    rep = replay_cases(MORE)
    sessions = json.loads(MORE.read_text())
    assert rep.sessions == len(sessions) == 72
    assert {s["policy"] for s in sessions} == {"firstnodex", "locality", "variation"}
    assert rep.steps == sum(
        1 for s in sessions for st in s["steps"] if st["cmd"].startswith("match")
    )
    assert rep.mismatched == 0, "\n".join(rep.messages[:5])


@pytest.mark.skipif(not MORE.exists(), reason=f"{MORE} not found")
def test_variation_answers_depend_on_set_property(tmp_path: Path) -> None:
    """Without its set-property steps a variation session no longer reproduces Fluxion's
    answers: the replay really applies them (and the policy really reads perf_class)."""
    sessions = json.loads(MORE.read_text())
    picked = [
        s for s in sessions
        if s["policy"] == "variation" and s["name"] == "fill-node1_excl"
    ]
    assert len(picked) == 2  # tiny and medium
    stripped = [
        {**s, "steps": [st for st in s["steps"] if not st["cmd"].startswith("set-property")]}
        for s in picked
    ]
    for name in {s["graph"] for s in picked}:
        (tmp_path / name).symlink_to(MORE.parent / name)
    (tmp_path / "jobspecs").symlink_to(MORE.parent / "jobspecs")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(picked))
    assert replay_cases(cases).mismatched == 0
    cases.write_text(json.dumps(stripped))
    rep = replay_cases(cases)
    assert rep.bad_sessions == 2 and rep.mismatched > 0


def _app() -> typer.Typer:
    from fluxnetes.cli import match_cmd

    return cli_app(match_cmd)


def test_cli_replay_reports_and_exits_nonzero_on_mismatch(tmp_path: Path) -> None:
    sessions = json.loads(CASES.read_text())
    base = CASES.parent
    # one good session, one with a tampered answer; paths relative to the cases file's folder
    good = sessions[0]
    bad = json.loads(json.dumps(sessions[1]))
    bad["steps"][0]["jobid"] = 99
    for name in {good["graph"], bad["graph"]}:
        (tmp_path / name).write_text((base / name).read_text())
    (tmp_path / "jobspecs").mkdir()
    for f in (base / "jobspecs").iterdir():
        (tmp_path / "jobspecs" / f.name).write_text(f.read_text())
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([good, bad]))
    res = CliRunner().invoke(_app(), ["match", "--replay", str(cases)])
    assert res.exit_code == 1
    assert "MISMATCH" in res.output and "step 0" in res.output
    assert "2 sessions" in res.output and "1 mismatched" in res.output
    cases.write_text(json.dumps([good]))
    res = CliRunner().invoke(_app(), ["match", "--replay", str(cases)])
    assert res.exit_code == 0, res.output
    assert "0 mismatched" in res.output


def test_worked_example_spec_1_5() -> None:
    """fluxion-spec §1.5: node[1]->slot[1]->{core[2], gpu[1]} with policy low on the §1.4 graph."""
    from fluxnetes.graph import read_jgf
    from fluxnetes.match import Matcher

    nodes = [
        ("0", "cluster", {"basename": "tiny", "name": "tiny0", "id": 0, "rank": -1}, "/tiny0"),
        (
            "1",
            "node",
            {"basename": "node", "name": "node0", "id": 0, "rank": 0, "properties": {"ssd": ""}},
            "/tiny0/node0",
        ),
        ("2", "core", {"id": 0, "rank": 0}, "/tiny0/node0/core0"),
        ("3", "core", {"id": 1, "rank": 0}, "/tiny0/node0/core1"),
        ("4", "gpu", {"id": 0, "rank": 0}, "/tiny0/node0/gpu0"),
        ("5", "memory", {"id": 0, "rank": 0, "size": 16, "unit": "GB"}, "/tiny0/node0/memory0"),
        (
            "6",
            "node",
            {"basename": "node", "name": "node1", "id": 1, "rank": 1, "status": 0},
            "/tiny0/node1",
        ),
        ("7", "core", {"id": 0, "rank": 1}, "/tiny0/node1/core0"),
        ("8", "core", {"id": 1, "rank": 1}, "/tiny0/node1/core1"),
        ("9", "gpu", {"id": 0, "rank": 1}, "/tiny0/node1/gpu0"),
        ("10", "memory", {"id": 0, "rank": 1, "size": 16, "unit": "GB"}, "/tiny0/node1/memory0"),
    ]
    jgf = {
        "graph": {
            "nodes": [
                {
                    "id": i,
                    "metadata": {"type": t, "uniq_id": int(i), **md, "paths": {"containment": p}},
                }
                for i, t, md, p in nodes
            ],
            "edges": [
                {"source": "0", "target": "1", "metadata": {"subsystem": "containment"}},
                *({"source": "1", "target": t} for t in "2345"),
                {"source": "0", "target": "6"},
                *({"source": "6", "target": t} for t in ("7", "8", "9", "10")),
            ],
        }
    }
    m = Matcher(read_jgf(jgf), "low", tie_break="fluxion")
    js = {
        "version": 9999,
        "resources": [
            {
                "type": "node",
                "count": 1,
                "with": [
                    {
                        "type": "slot",
                        "count": 1,
                        "label": "default",
                        "with": [{"type": "core", "count": 2}, {"type": "gpu", "count": 1}],
                    }
                ],
            }
        ],
        "tasks": [{"command": ["app"], "slot": "default", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": 3600}},
    }
    r = m.allocate(js)
    assert r.ok and r.jobid == 1
    expected = {
        "graph": {
            "nodes": [
                {
                    "id": "2",
                    "metadata": {
                        "type": "core",
                        "id": 0,
                        "rank": 0,
                        "exclusive": True,
                        "paths": {"containment": "/tiny0/node0/core0"},
                    },
                },
                {
                    "id": "3",
                    "metadata": {
                        "type": "core",
                        "id": 1,
                        "rank": 0,
                        "exclusive": True,
                        "paths": {"containment": "/tiny0/node0/core1"},
                    },
                },
                {
                    "id": "4",
                    "metadata": {
                        "type": "gpu",
                        "id": 0,
                        "rank": 0,
                        "exclusive": True,
                        "paths": {"containment": "/tiny0/node0/gpu0"},
                    },
                },
                {
                    "id": "1",
                    "metadata": {
                        "type": "node",
                        "id": 0,
                        "rank": 0,
                        "properties": {"ssd": ""},
                        "paths": {"containment": "/tiny0/node0"},
                    },
                },
                {
                    "id": "0",
                    "metadata": {
                        "type": "cluster",
                        "basename": "tiny",
                        "id": 0,
                        "rank": -1,
                        "paths": {"containment": "/tiny0"},
                    },
                },
            ],
            "edges": [
                {"source": "1", "target": "2"},
                {"source": "1", "target": "3"},
                {"source": "1", "target": "4"},
                {"source": "0", "target": "1"},
            ],
        }
    }
    assert r.to_jgf() == expected
    rv1 = r.to_rv1()
    assert rv1["execution"]["R_lite"] == [{"rank": "0", "children": {"core": "0-1", "gpu": "0"}}]
    assert rv1["execution"]["nodelist"] == ["node0"]
    assert rv1["execution"]["properties"] == {"ssd": "0"}
    assert (rv1["execution"]["starttime"], rv1["execution"]["expiration"]) == (0, 3600)
