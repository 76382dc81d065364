"""Run one command on this node for ``nodes exec``, as the agent's configured unprivileged user.

The command is an argv list (no shell). When the agent runs as root it switches to the
configured user (setuid/setgid, no supplementary groups) in the child; when it does not run as
root it refuses a configured user other than its own. An agent running as root with no
configured user refuses too: exec never runs as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
from dataclasses import asdict, dataclass
from typing import Any

MAX_OUTPUT = 1024 * 1024  # per stream, per node


@dataclass
class ExecResult:
    node: str
    rank: int
    returncode: int | None  # None: did not run or was killed for the timeout
    stdout: str = ""
    stderr: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExecResult:
        return cls(str(d["node"]), int(d["rank"]), d.get("returncode"), str(d.get("stdout", "")),
                   str(d.get("stderr", "")), str(d.get("error", "")))


@dataclass(frozen=True)
class RunAs:
    user: str
    uid: int
    gid: int


class ExecRefused(Exception):
    """This agent may not run commands as asked (wrong user, root)."""


def resolve_user(configured: str | None) -> RunAs | None:
    """Whom to run as: None = the agent's own user (allowed only when that is not root)."""
    euid = os.geteuid()
    if not configured:
        if euid == 0:
            raise ExecRefused("the agent runs as root and no exec user is configured "
                              "(--exec-user / chart agent.exec.user); exec never runs as root")
        return None
    try:
        pw = pwd.getpwnam(configured) if not configured.isdigit() else pwd.getpwuid(int(configured))
    except KeyError:
        raise ExecRefused(f"exec user {configured!r} does not exist on this node") from None
    if pw.pw_uid == 0:
        raise ExecRefused(f"exec user {configured!r} is root; configure an unprivileged user")
    if euid != 0 and pw.pw_uid != euid:
        raise ExecRefused(f"the agent runs as uid {euid}, not root, so it cannot switch to "
                          f"{configured!r} (uid {pw.pw_uid})")
    if pw.pw_uid == euid:
        return None
    return RunAs(pw.pw_name, pw.pw_uid, pw.pw_gid)


async def run(node: str, rank: int, argv: list[str], configured_user: str | None,
              timeout: float, cwd: str | None = None) -> ExecResult:
    if not argv or not all(isinstance(a, str) for a in argv):
        return ExecResult(node, rank, None, error="empty command")
    try:
        who = resolve_user(configured_user)
    except ExecRefused as exc:
        return ExecResult(node, rank, None, error=str(exc))
    kwargs: dict[str, Any] = {}
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if who is not None:
        kwargs.update(user=who.uid, group=who.gid, extra_groups=[])
        env["HOME"] = "/"
        env["USER"] = who.user
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd or "/", start_new_session=True,
            **kwargs)
    except (OSError, ValueError) as exc:
        return ExecResult(node, rank, None, error=f"cannot start {argv[0]!r}: {exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        return ExecResult(node, rank, None, error=f"timed out after {timeout:g} s (killed)")
    return ExecResult(node, rank, proc.returncode, _clip(out), _clip(err))


def _clip(data: bytes) -> str:
    text = data[:MAX_OUTPUT].decode(errors="replace")
    if len(data) > MAX_OUTPUT:
        text += f"\n[... {len(data) - MAX_OUTPUT} more bytes cut]\n"
    return text
