"""A resource-query-like command session over a Matcher, and the conformance replayer.

Both read files (graphs, jobspecs, cases) but no clock: the session keeps its own ``now``
that only ``advance SECONDS`` moves.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fluxnetes.graph import GraphError, ResourceGraph, load_graph, read_jgf
from fluxnetes.jobspec import JobspecError, parse_jobspec
from fluxnetes.match.matcher import Matcher
from fluxnetes.match.results import MatchError, MatchResult, NodeShare

HELP = """commands:
  match allocate|allocate_with_satisfiability|allocate_orelse_reserve|satisfiability FILE
  cancel JOBID                      partial-cancel JOBID FILE (R/JGF json, or YAML list of
  info JOBID                          {name, cores, gpus, memory, extra})
  update-allocate JOBID FILE        record an existing placement (same FILE forms)
  set-status PATH|NODE up|down      set-property PATH|NODE KEY=VALUE (perf_class orders
  stat      now      advance SECONDS      help      quit          the variation policy)"""


def simple_lines(r: MatchResult) -> list[str]:
    """resource-query 'simple' writer: one line per vertex, children before parents."""
    lines = []
    for v in r.vertices:
        depth = v.path.count("/") - 1
        lines.append(f"      {'---' * depth}{v.name}[{v.size}:{'x' if v.exclusive else 's'}]")
    return lines


@dataclass
class Session:
    matcher: Matcher
    fmt: str = "simple"
    base: Path = field(default_factory=Path.cwd)
    now: int = 0
    out: Callable[[str], None] = print
    err: Callable[[str], None] = print

    def run(self, lines: Iterable[str]) -> int:
        """Execute commands; returns the number of commands that failed."""
        errors = 0
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                if self.execute(line) is False:
                    break
            except (MatchError, JobspecError, GraphError, OSError, ValueError) as exc:
                errors += 1
                self.err(f"error: {line}: {exc}")
        return errors

    def _path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.base / p

    def _read(self, name: str) -> str:
        p = self._path(name)
        try:
            return p.read_text()
        except OSError as exc:
            raise OSError(f"cannot read {p}: {exc.strerror}") from None

    def execute(self, line: str) -> bool | None:
        words = shlex.split(line)
        cmd, args = words[0], words[1:]
        m = self.matcher
        if cmd in ("quit", "exit"):
            return False
        if cmd == "help":
            self.out(HELP)
        elif cmd == "match":
            if len(args) != 2:
                raise ValueError("usage: match OP FILE")
            js = parse_jobspec(self._read(args[1]))
            r = m.match(args[0], js, now=self.now)
            self.print_result(r)
        elif cmd == "cancel":
            m.cancel(_jobid(args))
            self.out(f"cancelled job {args[0]}")
        elif cmd == "partial-cancel":
            if len(args) != 2:
                raise ValueError("usage: partial-cancel JOBID FILE")
            done = m.partial_cancel(_jobid(args[:1]), self._placement(args[1]))
            self.out(f"partially cancelled job {args[0]}{' (nothing left: job removed)' if done else ''}")
        elif cmd == "update-allocate":
            if len(args) != 2:
                raise ValueError("usage: update-allocate JOBID FILE")
            r = m.update_allocate(_jobid(args[:1]), self._placement(args[1]), at=self.now)
            self.print_result(r)
        elif cmd == "info":
            self.out(json.dumps(m.info(_jobid(args))))
        elif cmd == "stat":
            self.out(json.dumps(m.stat(), indent=1))
        elif cmd == "set-status":
            if len(args) != 2 or args[1] not in ("up", "down"):
                raise ValueError("usage: set-status PATH up|down")
            m.set_status(args[0], args[1] == "up")
            self.out(f"{args[0]} is {args[1]}")
        elif cmd == "set-property":
            key, value = _property(args)
            m.set_property(args[0], key, value)
            self.out(f"{args[0]}: {key}={value}")
        elif cmd == "advance":
            if len(args) != 1 or not args[0].isdigit():
                raise ValueError("usage: advance SECONDS (a non-negative integer)")
            self.now += int(args[0])
            self.out(f"now = {self.now}")
        elif cmd == "now":
            self.out(f"now = {self.now}")
        else:
            raise ValueError(f"unknown command '{cmd}' (try: help)")
        return None

    def _placement(self, name: str) -> Any:
        text = self._read(name)
        data = yaml.load(text, Loader=yaml.CSafeLoader)
        if isinstance(data, list):
            shares = []
            for i, d in enumerate(data):
                if not isinstance(d, dict) or "name" not in d:
                    raise ValueError(f"{name}[{i}]: each entry needs a node name")
                shares.append(NodeShare(str(d["name"]), str(d.get("path", "")), int(d.get("cores", 0)),
                                        int(d.get("gpus", 0)), int(d.get("memory", 0)),
                                        {str(k): int(v) for k, v in (d.get("extra") or {}).items()}))
            return shares
        if isinstance(data, dict):
            return data
        raise ValueError(f"{name}: expected R/JGF (mapping) or a list of node shares")

    def print_result(self, r: MatchResult) -> None:
        if not r.ok:
            self.out(f"INFO: JOBID={r.jobid} {r.status.value}: {r.reason}")
            return
        if self.fmt == "jgf":
            self.out(json.dumps(r.to_jgf()))
        elif self.fmt == "rv1":
            self.out(json.dumps(r.to_rv1()))
        else:
            for ln in simple_lines(r):
                self.out(ln)
        when = "Now" if r.at == self.now else str(r.at)
        self.out(f"INFO: JOBID={r.jobid} RESOURCES={r.status.value} SCHEDULED AT={when}")


def _property(args: list[str]) -> tuple[str, str]:
    """``PATH KEY=VALUE`` -> (KEY, VALUE)."""
    if len(args) != 2 or "=" not in args[1] or args[1].startswith("="):
        raise ValueError("usage: set-property PATH KEY=VALUE")
    key, _, value = args[1].partition("=")
    return key, value


def _jobid(args: list[str]) -> int:
    if len(args) != 1:
        raise ValueError("expected one JOBID")
    try:
        return int(args[0])
    except ValueError:
        raise ValueError(f"'{args[0]}' is not a job id") from None


# ----------------------------------------------------------------------------- replay


@dataclass
class ReplayReport:
    sessions: int = 0
    steps: int = 0
    mismatched: int = 0
    bad_sessions: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    def summary(self) -> str:
        return (f"replayed {self.sessions} sessions: {self.steps} match steps checked, "
                f"{self.mismatched} mismatched ({self.bad_sessions} sessions with mismatches)")


def _vertex_rows(r: MatchResult) -> list[dict[str, Any]]:
    rows = [{"path": v.path, "type": v.type, "exclusive": v.exclusive, "size": v.size} for v in r.vertices]
    return sorted(rows, key=lambda x: x["path"])


def replay_cases(cases_path: str | Path, *, only: Callable[[dict[str, Any]], bool] | None = None,
                 on_message: Callable[[str], None] | None = None) -> ReplayReport:
    """Replay a cases file (fluxion-conformance format); paths are relative to its folder."""
    cases_path = Path(cases_path)
    base = cases_path.parent
    try:
        cases = json.loads(cases_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cases_path}: cannot read cases: {exc}") from None
    if not isinstance(cases, list):
        raise ValueError(f"{cases_path}: expected a list of sessions")
    rep = ReplayReport()
    graphs: dict[str, Any] = {}
    specs: dict[str, Any] = {}

    def say(msg: str) -> None:
        rep.messages.append(msg)
        if on_message:
            on_message(msg)

    for si, sess in enumerate(cases):
        if only is not None and not only(sess):
            continue
        rep.sessions += 1
        gname = sess["graph"]
        if gname not in graphs:
            graphs[gname] = json.loads((base / gname).read_text())
        graph: ResourceGraph = read_jgf(graphs[gname])
        m = Matcher(graph, sess["policy"], tie_break="fluxion")
        label = f"session {si} ({gname} {sess['policy']} {sess.get('name', '')})"
        bad = 0
        for i, st in enumerate(sess["steps"]):
            words = st["cmd"].split()
            if words[0] == "match":
                op, fname = words[1], words[2]
                if fname not in specs:
                    specs[fname] = parse_jobspec((base / fname).read_text())
                r = m.match(op, specs[fname], now=0)
                rep.steps += 1
                if st.get("status") == "FAILED":
                    exp: Any = {"status": "FAILED"}
                    got: Any = {"status": "FAILED"} if not r.ok else {
                        "status": r.status.value, "jobid": r.jobid, "at": r.at}
                else:
                    exp = {"status": st["status"], "jobid": st["jobid"], "at": st["at"],
                           "vertices": st["vertices"]}
                    got = {"status": r.status.value if r.ok else "FAILED", "jobid": r.jobid,
                           "at": r.at, "vertices": _vertex_rows(r) if r.ok else []}
                    if not r.ok:
                        got = {"status": "FAILED", "reason": r.reason}
                if exp != got:
                    bad += 1
                    rep.mismatched += 1
                    say(f"MISMATCH {label} step {i} `{st['cmd']}`\n  expected: {_short(exp)}\n  got:      {_short(got)}")
            elif words[0] == "set-property":
                key, value = _property(words[1:])
                m.set_property(words[1], key, value)
            elif words[0] == "cancel":
                expect_err = bool(st.get("errors"))
                try:
                    m.cancel(int(words[1]))
                    got_err = False
                except MatchError:
                    got_err = True
                if expect_err != got_err:
                    say(f"NOTE {label} step {i} `{st['cmd']}`: reference error={expect_err}, ours={got_err}")
            else:
                bad += 1
                rep.mismatched += 1
                say(f"MISMATCH {label} step {i}: unsupported command `{st['cmd']}`")
        if bad:
            rep.bad_sessions += 1
    return rep


def _short(obj: Any, limit: int = 600) -> str:
    s = json.dumps(obj)
    return s if len(s) <= limit else s[:limit] + "..."


def load_graph_any(path: str | Path) -> ResourceGraph:
    return load_graph(path)
