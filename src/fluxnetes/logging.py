"""Structured logs: one JSON object per line, carrying the job and group a line is about.

Usage::

    from fluxnetes.logging import configure_logging, log_context, get_logger

    configure_logging(level="INFO", fmt="json")      # once, at process start
    log = get_logger("fluxnetes.queue")
    with log_context(job="default/train", group="train", namespace="default"):
        log.info("reserved", extra={"expected_start": 1712345678})

Fields set by :func:`log_context` apply to every record logged inside the ``with`` block, in
the same thread or asyncio task (contextvars), so handlers deep in the call stack need not pass
names around. ``extra={...}`` adds fields to a single record.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import json
import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import orjson

# Context fields that may be bound; anything else in extra= is also emitted, these are just
# the ones with a fixed meaning across the code base.
CONTEXT_FIELDS: tuple[str, ...] = (
    "job",
    "group",
    "namespace",
    "pod",
    "node",
    "jobid",
    "controller",
)

# Default None (not {}): a shared mutable default would leak fields between contexts.
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fluxnetes_log_context", default=None
)


def _bound() -> dict[str, Any]:
    return _context.get() or {}


# Attributes every LogRecord has; whatever else is on a record came from extra=.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind ``fields`` (job=, group=, namespace=, ...) to all records logged in this block.
    Nested blocks add to (and may override) the outer fields. ``None`` values are dropped."""
    merged = {**_bound(), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    """The fields bound by the enclosing :func:`log_context` blocks."""
    return dict(_bound())


class ContextFilter(logging.Filter):
    """Copies the bound context onto each record (so any formatter can use it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _bound().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


_PLAIN = frozenset({str, int, float, bool, type(None)})  # written as they are (_jsonable's first case)


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return str(value)


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text (one
# tuple, read and replaced whole: threads that log (the lease's) never see a half-updated pair)


def _utc_ms(t: float) -> str:
    """``datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")``, with the date
    and time of day formatted once per second (the formatting was a fifth of a log line's
    cost). The microseconds are rounded as datetime rounds them (half to even), then cut to
    milliseconds as isoformat cuts them."""
    sec = math.floor(t)
    us = round((t - sec) * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    global _second
    known = _second
    if known[0] != sec:
        known = _second = (sec, _dt.datetime.fromtimestamp(sec, tz=_dt.UTC).isoformat()[:19])
    return f"{known[1]}.{us // 1000:03d}+00:00"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", <context and extra fields>, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _utc_ms(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _bound().items():
            out.setdefault(key, value if type(value) in _PLAIN else _jsonable(value))
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and key[:1] != "_":
                out[key] = value if type(value) in _PLAIN else _jsonable(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        try:
            # orjson: a line is written per phase change of every group, and json.dumps was
            # most of the formatter's time (8 against 1 us a line)
            return orjson.dumps(out).decode()
        except orjson.JSONEncodeError:  # e.g. an int past 64 bits; json writes anything
            return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Human-readable lines for terminals: ``time level logger: msg key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {**_bound()}
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                fields[key] = value
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def configure_logging(
    level: str | int = "INFO", fmt: str = "json", stream: TextIO | None = None
) -> logging.Handler:
    """Install one handler on the root logger (replacing earlier ones installed here).

    ``fmt`` is ``json`` (in cluster) or ``text`` (terminals). Returns the handler."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log format: must be 'json' or 'text', got {fmt!r}")
    if isinstance(level, str):
        numeric = logging.getLevelName(level.upper())
        if not isinstance(numeric, int):
            raise ValueError(
                f"log level: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {level!r}"
            )
        level = numeric
    # Neither formatter writes where a call was made from, its thread or its process (those
    # record attributes are never emitted: _RECORD_ATTRS), so the records need not collect them
    # (the logging HOWTO's "Optimization"): ~5 us less per line, and the operator writes a
    # line per phase change of every group (bench/event_handlers.py)
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.set_name("fluxnetes")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "fluxnetes":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def configure_from_env(
    level: str | int = "INFO", environ: dict[str, str] | None = None
) -> logging.Handler:
    """:func:`configure_logging` with the format from ``$FLUXNETES_LOG_FORMAT`` (set by the
    Helm chart; default ``json`` when stderr is not a terminal, else ``text``)."""
    import os

    env = os.environ if environ is None else environ
    fmt = env.get("FLUXNETES_LOG_FORMAT", "").strip().lower()
    if not fmt:
        fmt = "text" if sys.stderr.isatty() else "json"
    return configure_logging(level, fmt)
