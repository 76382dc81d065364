"""The crash points (fluxnetes.k8s.crashpoints) and the restart tests' hook (tests/crashhook):
nothing happens at a point unless a hook is installed; the hook exits where asked, holds
placement or drops FluxJob writes for its windows; a process started with the hook's folder
on PYTHONPATH installs it by itself (how the restart tests start the operator)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.k8s import crashpoints

sys.path.insert(0, str(Path(__file__).resolve().parent / "crashhook"))
from crashhook import make_hook, slow_cycles

HOOK_DIR = str(Path(__file__).resolve().parent / "crashhook")


class Exited(Exception):
    pass


def _exit(point: str, facts: dict[str, Any]) -> None:
    raise Exited(point)


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    crashpoints.install(None)


def test_without_a_hook_nothing_happens() -> None:
    assert crashpoints.hit("allocated", "ns/a") is False
    assert crashpoints.hit("placement", "ns/a") is False


def test_installed_hook_sees_the_point_and_its_facts() -> None:
    seen: list[tuple[str, str, dict[str, object]]] = []
    crashpoints.install(lambda p, q, f: seen.append((p, q, f)) or p == "placement")
    assert crashpoints.hit("pod-placed", "ns/a", pod="u1", size=2) is False
    assert crashpoints.hit("placement", "ns/a") is True
    assert seen[0] == ("pod-placed", "ns/a", {"pod": "u1", "size": 2})


def test_hook_exits_at_its_point_for_its_group_only() -> None:
    hook = make_hook("allocated@ns/a", _exit)
    assert hook("allocated", "ns/b", {}) is False
    assert hook("resumed", "ns/a", {}) is False
    with pytest.raises(Exited, match="allocated"):
        hook("allocated", "ns/a", {})
    with pytest.raises(Exited):
        make_hook("store-completed", _exit)("store-completed", "x/y", {})


def test_placed_window_drops_writes_and_exits_once_every_pod_is_placed() -> None:
    hook = make_hook("placed@ns/a", _exit)
    assert hook("fluxjob-write", "ns/a", {}) is False  # before the allocation: written
    hook("allocated", "ns/a", {})
    assert hook("placement", "ns/a", {}) is False  # placed as usual
    assert hook("fluxjob-write", "ns/a", {}) is True  # dropped from now on
    hook("pod-placed", "ns/a", {"pod": "u1", "size": 2})
    hook("pod-placed", "ns/a", {"pod": "u1", "size": 2})  # the same pod again
    with pytest.raises(Exited, match="placed"):
        hook("pod-placed", "ns/a", {"pod": "u2", "size": 2})


def test_placed_in_part_window_places_k_pods_then_exits() -> None:
    hook = make_hook("placed:2@ns/a", _exit)
    assert hook("pod-place", "ns/a", {"pod": "u1"}) is False  # not allocated yet: not this window's
    hook("allocated", "ns/a", {})
    assert hook("fluxjob-write", "ns/a", {}) is True
    assert hook("pod-place", "ns/a", {"pod": "u1"}) is False
    assert hook("pod-place", "ns/a", {"pod": "u2"}) is False
    assert hook("pod-place", "ns/a", {"pod": "u3"}) is True  # held back: stays gated
    assert hook("pod-place", "ns/a", {"pod": "u1"}) is False  # (a retry of a placed one)
    hook("pod-placed", "ns/a", {"pod": "u1", "size": 4})
    with pytest.raises(Exited, match="placed"):
        hook("pod-placed", "ns/a", {"pod": "u2", "size": 4})


def test_fluxjob_running_window_holds_placement_until_running_is_written() -> None:
    hook = make_hook("fluxjob-running", _exit)
    assert hook("placement", "ns/a", {}) is True
    hook("fluxjob-written", "ns/a", {"phase": "Pending"})
    with pytest.raises(Exited, match="fluxjob-running"):
        hook("fluxjob-written", "ns/a", {"phase": "Running"})


def test_slow_cycles_hold_the_loop_before_each_cycle_only() -> None:
    slept: list[float] = []
    hook = slow_cycles("12", slept.append)
    assert hook("allocated", "ns/a", {}) is False and slept == []
    assert hook("cycle", "", {}) is False and slept == [12.0]


def test_a_process_started_with_the_hook_folder_installs_it() -> None:
    code = ("from fluxnetes.k8s import crashpoints\n"
            "crashpoints.hit('allocated', 'ns/b', flush=lambda: print('flushed', flush=True))\n"
            "crashpoints.hit('allocated', 'ns/a', flush=lambda: print('flushed', flush=True))\n"
            "print('not reached')\n")
    env = {**os.environ, "FLUXNETES_DEBUG_EXIT_AT": "allocated@ns/a",
           "PYTHONPATH": os.pathsep.join(p for p in (HOOK_DIR, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 137, res.stderr
    assert res.stdout == "flushed\n"
    assert "exiting here on purpose" in res.stderr
    env.pop("FLUXNETES_DEBUG_EXIT_AT")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "not reached\n", res.stderr


def test_a_process_started_with_a_slow_cycle_holds_its_cycles() -> None:
    code = ("from fluxnetes.k8s import crashpoints\n"
            "print(crashpoints.hit('cycle', ''), crashpoints.hit('allocated', 'ns/a'))\n")
    env = {k: v for k, v in os.environ.items() if k != "FLUXNETES_DEBUG_EXIT_AT"}
    env.update({"FLUXNETES_DEBUG_SLOW_CYCLE": "0.01",
                "PYTHONPATH": os.pathsep.join(p for p in (HOOK_DIR, os.environ.get("PYTHONPATH")) if p)})
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "False False\n", res.stderr
    assert "holding the event loop" in res.stderr
