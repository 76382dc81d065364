"""Start, recognise and stop the control plane's processes by their own pids.

A pid alone can be reused after its process ended, so every record also keeps the process's
start time (field 22 of /proc/<pid>/stat): a pid whose start time differs is someone else's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fluxnetes.devcluster.errors import ClusterError

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    log: str


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may contain spaces: split after the last ')'
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def is_running(rec: ProcessRecord) -> bool:
    st = _stat(rec.pid)
    return st is not None and st[1] == rec.start_ticks and st[0] not in ("Z", "X")


def rss_mib(pid: int) -> float | None:
    """Resident memory of a live pid (VmRSS of /proc/<pid>/status), MiB; None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError, IndexError):
        return None
    return None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# for other spawners (the chaos soak's operator processes): the same parent-death signal
die_with_parent_hook = _die_with_parent


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path,
    die_with_parent: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `argv` in its own session (so Ctrl-C of the caller does not reach it), output to log.

    env: variables added to this process's environment.
    die_with_parent: the kernel sends SIGTERM when the starting thread ends (for test
    fixtures, so a hard-killed pytest leaves nothing behind); off for `dev cluster up`,
    whose processes must outlive the command.
    """
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    st = _stat(proc.pid)
    ticks = st[1] if st else 0
    return proc, ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks, log=str(log_path))


def _reap(pid: int) -> None:
    # only succeeds for our own children; others are reaped by their new parent
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(recs: list[ProcessRecord], deadline: float) -> list[ProcessRecord]:
    """Poll until every record has ended or the deadline passed; returns those still alive."""
    while True:
        for rec in recs:
            _reap(rec.pid)
        alive = [r for r in recs if is_running(r)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop(records: Iterable[ProcessRecord], timeout: float = 15.0) -> list[str]:
    """SIGTERM every record still running, SIGKILL what outlives `timeout` seconds.

    Returns the names of processes that had to be killed. Never signals a reused pid.
    """
    recs = [r for r in records if is_running(r)]
    for rec in recs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)
    alive = _wait_gone(recs, time.monotonic() + timeout)
    for rec in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGKILL)
    _wait_gone(alive, time.monotonic() + 5.0)
    return [r.name for r in alive]


def signal_and_wait(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float = 30.0) -> None:
    """Send ``sig`` to a child still running and wait for it; SIGKILL it after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def raise_if_exited(records: Iterable[ProcessRecord], what: str) -> None:
    """ClusterError naming the first of `records` no longer running, with the end of its log:
    a wait for `what` fails at once instead of at its deadline."""
    for rec in records:
        if not is_running(rec):
            raise ClusterError(
                f"{rec.name} exited while waiting for {what}; end of {rec.log}:\n"
                f"{log_tail(rec.log)}"
            )


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
