"""Standard Workload Format (SWF 2.2) reader.

The format (Parallel Workloads Archive, Feitelson et al.): header comment lines start with
``;`` and may carry ``Key: value`` pairs (MaxNodes, MaxProcs, ...); every other non-blank line
holds 18 whitespace-separated numeric fields, ``-1`` meaning "unknown". Time fields may be
floating point; they are rounded to whole seconds here (the simulator clock is an int).

Bad lines are never silently accepted: each becomes an :class:`SwfProblem` naming the line
number and the rule. With ``strict=True`` the first problem raises :class:`SwfError`.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any, NamedTuple

#: The 18 SWF fields, in order (names used in messages and CSV output).
FIELDS: tuple[str, ...] = (
    "job_number",
    "submit_time",
    "wait_time",
    "run_time",
    "allocated_procs",
    "avg_cpu_time",
    "used_memory",
    "requested_procs",
    "requested_time",
    "requested_memory",
    "status",
    "user_id",
    "group_id",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_time",
)

# fields that are times or amounts and may legitimately be fractional in the format
_FLOAT_FIELDS = frozenset({"submit_time", "wait_time", "run_time", "avg_cpu_time",
                           "used_memory", "requested_time", "requested_memory", "think_time"})

#: SWF status codes (field 11).
STATUS_FAILED = 0
STATUS_COMPLETED = 1
STATUS_CANCELLED = 5

UNKNOWN = -1


class SwfError(ValueError):
    """A malformed SWF input (raised in strict mode, or when nothing can be read)."""

    def __init__(self, message: str, line: int | None = None, source: str = "") -> None:
        where = f"{source}:{line}: " if line is not None else (f"{source}: " if source else "")
        super().__init__(f"{where}{message}")
        self.line = line
        self.source = source
        self.detail = message


@dataclass(frozen=True)
class SwfProblem:
    """One line that could not be used, with its 1-based line number and the reason."""

    line: int
    message: str
    text: str = ""

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class SwfRecord(NamedTuple):
    """One job record: the 18 SWF fields (``-1`` = unknown), plus its line number. (A named
    tuple: immutable, and about three times cheaper to build than a frozen dataclass, which
    matters when a trace has hundreds of thousands of lines.)"""

    job_number: int
    submit_time: int
    wait_time: int
    run_time: int
    allocated_procs: int
    avg_cpu_time: float
    used_memory: float
    requested_procs: int
    requested_time: int
    requested_memory: float
    status: int
    user_id: int
    group_id: int
    executable: int
    queue: int
    partition: int
    preceding_job: int
    think_time: int
    line: int = 0

    @property
    def procs(self) -> int:
        """Processors the job asks for: requested, or allocated when the request is unknown
        (the usual convention for SWF logs that only recorded the allocation)."""
        return self.requested_procs if self.requested_procs > 0 else self.allocated_procs

    @property
    def cancelled_before_start(self) -> bool:
        """SWF: a cancelled job (status 5) that never ran has no positive run time."""
        return self.status == STATUS_CANCELLED and self.run_time <= 0


@dataclass
class SwfHeader:
    """Header comments. ``fields`` keeps every ``Key: value`` pair (continuation lines of a
    key are joined); the machine-size keys are parsed."""

    fields: dict[str, str] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)

    def _int(self, key: str) -> int | None:
        value = self.fields.get(key)
        if value is None:
            return None
        try:
            number = int(value.split()[0])
        except (ValueError, IndexError):
            return None
        return number if number > 0 else None

    @property
    def max_nodes(self) -> int | None:
        return self._int("MaxNodes")

    @property
    def max_procs(self) -> int | None:
        return self._int("MaxProcs")

    @property
    def max_runtime(self) -> int | None:
        return self._int("MaxRuntime")

    @property
    def computer(self) -> str:
        return self.fields.get("Computer", "")

    @property
    def acknowledge(self) -> str:
        return self.fields.get("Acknowledge", "")


@dataclass
class SwfTrace:
    """What a reader returns: the header, the usable records and the problems found."""

    header: SwfHeader
    records: list[SwfRecord]
    problems: list[SwfProblem]
    source: str = ""


def _parse_number(name: str, token: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ValueError(f"field {FIELDS.index(name) + 1} ({name}) is not a number: {token!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"field {FIELDS.index(name) + 1} ({name}) is not finite: {token!r}")
    if value < 0 and value != UNKNOWN:
        raise ValueError(
            f"field {FIELDS.index(name) + 1} ({name}) is negative ({token}); "
            "only -1 (unknown) may be negative"
        )
    if name not in _FLOAT_FIELDS and value != int(value):
        raise ValueError(f"field {FIELDS.index(name) + 1} ({name}) must be an integer: {token!r}")
    return value


def parse_record(text: str, line: int = 0) -> SwfRecord:
    """Parse one data line; raises ValueError with the field and rule on bad input."""
    tokens = text.split()
    if len(tokens) != len(FIELDS):
        raise ValueError(f"expected {len(FIELDS)} fields, found {len(tokens)}")
    try:
        # fast path: the usual all-integer line with nothing below -1 and a submit time
        n = [int(tok) for tok in tokens]
    except ValueError:
        pass
    else:
        if min(n) >= -1 and n[1] != UNKNOWN:
            return SwfRecord(n[0], n[1], n[2], n[3], n[4], float(n[5]), float(n[6]), n[7], n[8],
                             float(n[9]), n[10], n[11], n[12], n[13], n[14], n[15], n[16],
                             n[17], line)
    values = [_parse_number(name, tok) for name, tok in zip(FIELDS, tokens, strict=True)]
    # times are rounded to whole seconds (the format allows fractions; the clock is an int)
    ints = [v if name in ("avg_cpu_time", "used_memory", "requested_memory")
            else (UNKNOWN if v == UNKNOWN else round(v))
            for name, v in zip(FIELDS, values, strict=True)]
    record = SwfRecord(
        job_number=int(ints[0]),
        submit_time=int(ints[1]),
        wait_time=int(ints[2]),
        run_time=int(ints[3]),
        allocated_procs=int(ints[4]),
        avg_cpu_time=float(ints[5]),
        used_memory=float(ints[6]),
        requested_procs=int(ints[7]),
        requested_time=int(ints[8]),
        requested_memory=float(ints[9]),
        status=int(ints[10]),
        user_id=int(ints[11]),
        group_id=int(ints[12]),
        executable=int(ints[13]),
        queue=int(ints[14]),
        partition=int(ints[15]),
        preceding_job=int(ints[16]),
        think_time=int(ints[17]),
        line=line,
    )
    if record.submit_time == UNKNOWN:
        raise ValueError("field 2 (submit_time) is unknown (-1); a job needs a submit time")
    return record


def iter_lines(path: str | Path) -> Iterator[str]:
    """Lines of a plain or gzip-compressed SWF file."""
    p = Path(path)
    if not p.exists():
        raise SwfError(f"no such file: {p}")
    if p.is_dir():
        raise SwfError(f"{p} is a directory, not an SWF file")
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    # one read and one split: several times faster than a line iterator over gzip
    yield from data.decode("utf-8", errors="replace").split("\n")


def read_lines(path: str | Path) -> list[str]:
    """All lines of a plain or gzip-compressed SWF file."""
    return list(iter_lines(path))


def _header_line(header: SwfHeader, raw: str, last_key: str | None) -> str | None:
    """Take one ``;`` comment line into ``header``; returns the key it continues or set."""
    body = raw.strip()[1:].strip()
    header.comments.append(body)
    key, sep, value = body.partition(":")
    if body and last_key is not None and raw.lstrip().startswith(";" + " " * 4):
        # indented continuation of the previous key (e.g. Information: url1 / url2)
        header.fields[last_key] = f"{header.fields[last_key]} {body}".strip()
    elif sep and key and " " not in key.strip():
        last_key = key.strip()
        header.fields[last_key] = value.strip()
    return last_key


def _parse_clean(lines: list[str], source: str) -> SwfTrace | None:
    """The whole file at once, when it is clean: every data line 18 integers, none below
    -1, every submit time known, no job number twice. The numbers are converted in one go
    and the records built column-wise (several times faster than line by line on a trace
    of hundreds of thousands of jobs). None when anything is off: the line-by-line reader
    then finds and names the problem."""
    header = SwfHeader()
    last_key: str | None = None
    start = 0
    while start < len(lines):  # the header: comment (and blank) lines before the first job
        raw = lines[start]
        stripped = raw.lstrip()
        if stripped and stripped[0] != ";":
            break
        if stripped:
            last_key = _header_line(header, raw, last_key)
        start += 1
    body = lines[start:]
    while body and not body[-1].strip():
        body.pop()
    if not body:
        return SwfTrace(header=header, records=[], problems=[], source=source)
    if ";" in "\n".join(body):
        return None  # comments between jobs: the line-by-line reader handles them
    splits = list(map(str.split, body))  # C-level loops from here on
    lengths = set(map(len, splits))
    numbers: Sequence[int]
    if lengths == {len(FIELDS)}:
        numbers = range(start + 1, start + 1 + len(splits))
    elif lengths == {0, len(FIELDS)}:  # blank lines between jobs
        numbers = [start + 1 + i for i, tokens in enumerate(splits) if tokens]
    else:
        return None
    try:
        values = list(map(int, chain.from_iterable(splits)))
    except ValueError:
        return None
    cols: list[list[Any]] = [values[k::18] for k in range(18)]
    if min(values) < UNKNOWN or UNKNOWN in cols[1] or len(set(cols[0])) != len(cols[0]):
        return None
    for k in (5, 6, 9):  # the fields that are amounts, kept as floats
        cols[k] = list(map(float, cols[k]))
    # tuple.__new__ is how a named tuple is made from an iterable (what _make does)
    records: list[SwfRecord] = list(map(tuple.__new__, repeat(SwfRecord), zip(*cols, numbers, strict=True)))
    return SwfTrace(header=header, records=records, problems=[], source=source)


def parse_lines(
    lines: Iterable[str], *, strict: bool = False, source: str = "<input>"
) -> SwfTrace:
    """Parse SWF text. Header comments fill the header; data lines become records.

    A malformed data line becomes a problem (strict=False) or raises SwfError (strict=True).
    Duplicate job numbers and submit times going backwards are reported too (the format says
    lines are sorted by submit time); the records are still returned in file order.
    """
    lines = lines if isinstance(lines, list) else list(lines)
    clean = _parse_clean(lines, source)
    if clean is not None:
        return clean
    header = SwfHeader()
    records: list[SwfRecord] = []
    problems: list[SwfProblem] = []
    seen: set[int] = set()
    last_key: str | None = None

    def problem(lineno: int, message: str, text: str) -> None:
        if strict:
            raise SwfError(message, line=lineno, source=source)
        problems.append(SwfProblem(lineno, message, text.strip()))

    for lineno, raw in enumerate(lines, start=1):
        tokens = raw.split()
        if not tokens:
            continue
        if tokens[0][0] == ";":
            last_key = _header_line(header, raw, last_key)
            continue
        record = None
        if len(tokens) == 18:
            # fast path: the usual all-integer line with nothing below -1 and a submit time
            try:
                n = list(map(int, tokens))
            except ValueError:
                pass
            else:
                if min(n) >= -1 and n[1] != UNKNOWN:
                    record = SwfRecord(n[0], n[1], n[2], n[3], n[4], float(n[5]), float(n[6]),
                                       n[7], n[8], float(n[9]), n[10], n[11], n[12], n[13],
                                       n[14], n[15], n[16], n[17], lineno)
        if record is None:
            try:
                record = parse_record(raw.strip(), lineno)
            except ValueError as exc:
                problem(lineno, str(exc), raw)
                continue
        if record.job_number in seen:
            problem(lineno, f"field 1 (job_number) {record.job_number} is used twice", raw)
            continue
        seen.add(record.job_number)
        records.append(record)
    return SwfTrace(header=header, records=records, problems=problems, source=source)


def read_swf(path: str | Path, *, strict: bool = False) -> SwfTrace:
    """Read an SWF file (plain or .gz)."""
    return parse_lines(read_lines(path), strict=strict, source=str(path))
