"""SWF reader, the published-studies filter, the machine."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from fluxnetes.sim.machine import MachineError, machine_from_header, machine_from_size
from fluxnetes.sim.swf import SwfError, parse_lines, read_swf
from fluxnetes.sim.workload import to_jobs

HEADER = """; Version: 2.2
; Computer: Test machine
; Information: http://example.org/
;              http://example.org/more
; MaxNodes: 4
; MaxProcs: 8
; Note: hand made
"""


def line(job: int, submit: int, run: int, procs: int, req_time: int, status: int = 1,
         req_procs: int | None = None) -> str:
    rp = procs if req_procs is None else req_procs
    return f"{job} {submit} 0 {run} {procs} -1 -1 {rp} {req_time} -1 {status} 1 1 -1 1 -1 -1 -1"


def test_header_and_all_18_fields() -> None:
    text = HEADER + "1 0 5 100 2 50.5 -1 2 200 -1 1 3 4 7 1 1 -1 -1\n"
    trace = parse_lines(text.splitlines(keepends=True))
    assert trace.header.max_nodes == 4 and trace.header.max_procs == 8
    assert trace.header.computer == "Test machine"
    assert trace.header.fields["Information"] == "http://example.org/ http://example.org/more"
    (r,) = trace.records
    assert (r.job_number, r.submit_time, r.wait_time, r.run_time, r.allocated_procs) == (1, 0, 5, 100, 2)
    assert (r.avg_cpu_time, r.requested_procs, r.requested_time, r.status) == (50.5, 2, 200, 1)
    assert (r.user_id, r.group_id, r.executable, r.queue, r.partition) == (3, 4, 7, 1, 1)
    assert (r.preceding_job, r.think_time, r.line) == (-1, -1, 8)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("1 0 0 10 2", "expected 18 fields, found 5"),
        ("1 0 0 ten 2 -1 -1 2 20 -1 1 1 1 -1 1 -1 -1 -1", "field 4 (run_time) is not a number"),
        ("1 0 0 10 -3 -1 -1 2 20 -1 1 1 1 -1 1 -1 -1 -1", "field 5 (allocated_procs) is negative"),
        ("1 0 0 10 2.5 -1 -1 2 20 -1 1 1 1 -1 1 -1 -1 -1", "field 5 (allocated_procs) must be an integer"),
        ("1 -1 0 10 2 -1 -1 2 20 -1 1 1 1 -1 1 -1 -1 -1", "field 2 (submit_time) is unknown"),
    ],
)
def test_malformed_lines_are_reported_with_line_number(bad: str, message: str) -> None:
    text = [HEADER, line(1, 0, 10, 1, 20), "\n", bad, "\n", line(3, 5, 10, 1, 20), "\n"]
    trace = parse_lines("".join(text).splitlines(keepends=True))
    assert [r.job_number for r in trace.records] == [1, 3]
    (problem,) = trace.problems
    assert problem.line == 9 and message in problem.message
    with pytest.raises(SwfError, match=rf"<input>:9: .*{message.split('(')[0]}"):
        parse_lines("".join(text).splitlines(keepends=True), strict=True)


def test_duplicate_job_number_reported() -> None:
    trace = parse_lines([line(1, 0, 10, 1, 20), line(1, 1, 10, 1, 20)])
    assert len(trace.records) == 1
    assert "used twice" in trace.problems[0].message and trace.problems[0].line == 2


def test_gzip_and_plain_files(tmp_path: Path) -> None:
    text = HEADER + line(1, 0, 10, 1, 20) + "\n"
    plain = tmp_path / "t.swf"
    plain.write_text(text)
    packed = tmp_path / "t.swf.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_swf(plain).records == read_swf(packed).records
    with pytest.raises(SwfError, match="no such file"):
        read_swf(tmp_path / "missing.swf")


def test_filter_drops_and_caps_and_reports() -> None:
    records = parse_lines([
        line(1, 0, 100, 2, 50),  # run > requested: capped to 50
        line(2, 1, 0, 2, 50),  # run time 0
        line(3, 2, 10, 2, -1),  # requested time unknown
        line(4, 3, 10, 99, 50),  # more processors than the machine
        line(5, 4, -1, 2, 50, status=5),  # cancelled before start
        line(6, 5, 10, -1, 50, req_procs=-1),  # processors unknown
        line(7, 6, 10, -1, 50, req_procs=3),  # allocated unknown, requested known
    ]).records
    jobs, report = to_jobs(records, machine_cores=8)
    assert [(j.id, j.runtime, j.estimate, j.procs) for j in jobs] == [("1", 50, 50, 2), ("7", 10, 50, 3)]
    assert report.capped == 1 and report.kept == 2 and report.total == 7
    assert sum(report.dropped.values()) == 5
    assert any("more processors" in k for k in report.dropped)
    assert any("cancelled" in k for k in report.dropped)
    assert report.examples[next(k for k in report.dropped if "cancelled" in k)] == [5]
    unfiltered, rep2 = to_jobs(records, machine_cores=8, filter_published=False, estimate="actual")
    ids = [j.id for j in unfiltered]
    assert ids == ["1", "2", "3", "4", "7"]  # impossible job 4 kept: the queue reports it
    assert unfiltered[0].runtime == 100 and unfiltered[0].estimate == 100
    assert rep2.capped == 0


def test_machine_from_header_and_size() -> None:
    trace = parse_lines(HEADER.splitlines(keepends=True))
    m = machine_from_header(trace.header)
    assert (m.nodes, m.cores_per_node, m.total_cores) == (4, 2, 8)
    with pytest.raises(MachineError, match="--nodes N --cores C"):
        machine_from_header(parse_lines([]).header)
    with pytest.raises(MachineError, match="--cores: must be >= 1"):
        machine_from_size(2, 0)
    whole = machine_from_size(3, 4, whole_nodes=True)
    from fluxnetes.sim.engine import SimJob

    job = SimJob("1", 0, 10, 10, 5)
    assert whole.min_cores(job) == 8
    assert whole.jobspec(job).totals["node"] == 2


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="0123456789 -.;:abcxX\t", max_size=80), max_size=8))
def test_garbage_is_reported_never_crashes(lines: list[str]) -> None:
    trace = parse_lines(line + "\n" for line in lines)
    data_lines = [i + 1 for i, text in enumerate(lines) if text.strip() and not text.strip().startswith(";")]
    reported = {p.line for p in trace.problems} | {r.line for r in trace.records}
    assert reported == set(data_lines)  # every data line is either a record or a problem
    for record in trace.records:
        assert record.submit_time >= 0
