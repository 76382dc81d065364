"""Unit level (no cluster): the operator's process runs on uvloop when it is installed
(k8s/event_loop.py), ``--event-loop asyncio`` / ``$FLUXNETES_EVENT_LOOP=asyncio`` opt out, a
missing uvloop falls back to asyncio's loop unless uvloop was insisted on, and bad values get
an error naming the setting."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fluxnetes.cli import run_cmd
from fluxnetes.k8s import operator as operator_mod
from fluxnetes.k8s.config import OperatorConfig
from fluxnetes.k8s.event_loop import ENV, EventLoopError, loop_factory, resolve_choice

uvloop = pytest.importorskip("uvloop")


def _loop_of_main(monkeypatch: pytest.MonkeyPatch, choice: str) -> str:
    """The module of the loop ``operator.main`` runs the operator on."""
    seen: list[str] = []

    async def fake_run(self: Any, stop: asyncio.Event | None = None) -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    monkeypatch.setattr(operator_mod.Operator, "run", fake_run)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        operator_mod.main(OperatorConfig(event_loop=choice))
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert len(seen) == 1
    return seen[0]


def test_the_operator_runs_on_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OperatorConfig().event_loop == "auto"
    assert _loop_of_main(monkeypatch, "auto").startswith("uvloop")
    assert _loop_of_main(monkeypatch, "uvloop").startswith("uvloop")


def test_asyncio_opts_out(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _loop_of_main(monkeypatch, "asyncio").startswith("asyncio")


def test_a_missing_uvloop_falls_back_unless_insisted_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    factory, name = loop_factory("auto")
    assert name == "asyncio" and factory is asyncio.new_event_loop
    with pytest.raises(EventLoopError, match="uvloop: it is not installed"):
        loop_factory("uvloop")
    assert _loop_of_main(monkeypatch, "auto").startswith("asyncio")


def test_the_choice_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_choice(None) == "auto"
    monkeypatch.setenv(ENV, " AsyncIO ")
    assert resolve_choice(None) == "asyncio"
    assert resolve_choice("uvloop") == "uvloop"  # the flag wins
    monkeypatch.setenv(ENV, "tokio")
    with pytest.raises(EventLoopError, match=f"{ENV}: must be one of auto, uvloop, asyncio, got 'tokio'"):
        resolve_choice(None)


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    run_cmd.register(app)
    return app


def test_the_cli_passes_the_choice_and_rejects_bad_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    got: list[OperatorConfig] = []
    monkeypatch.setattr(operator_mod, "main", got.append)
    monkeypatch.setattr("fluxnetes.logging.configure_logging", lambda *a, **k: None)
    monkeypatch.setattr("fluxnetes.logging.configure_from_env", lambda *a, **k: None)
    res = CliRunner().invoke(_cli(), ["run", "--event-loop", "asyncio"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(_cli(), ["run"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert [c.event_loop for c in got] == ["asyncio", "auto"]
    res = CliRunner().invoke(_cli(), ["run", "--event-loop", "trio"], env={"COLUMNS": "400"})
    assert res.exit_code == 2 and "--event-loop" in res.output and "auto, uvloop, asyncio" in res.output, res.output
    monkeypatch.setitem(sys.modules, "uvloop", None)
    res = CliRunner().invoke(_cli(), ["run", "--event-loop", "uvloop"], env={"COLUMNS": "400"})
    assert res.exit_code == 2 and "not installed" in res.output, res.output
