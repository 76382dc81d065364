"""Unit level (no cluster): the shortcuts on a single-pod Job's path (issue #31, the operator's
CPU per Job: bench/event_handlers.py, bench/http_costs.py) give what the general code gives.

- ``fluxjob.rfc3339`` formats whole seconds once each (a cache), other times as before;
- ``TimedMatcher`` counts each outcome on a counter child looked up once per status;
- the admission answer's JSON patch is encoded by orjson: the same operations as json's;
- a JSON log line holds the same fields, in the same order, as before its formatter's shortcuts.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from fluxnetes import logging as flog
from fluxnetes.k8s.admission import review
from fluxnetes.k8s.cluster.mirror import TimedMatcher
from fluxnetes.k8s.persistence import fluxjob
from fluxnetes.match.results import MatchStatus
from fluxnetes.metrics import METRICS


def _general(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("seconds", [0, 1, 59, 60, 1_764_474_000, 1_764_474_001, 4_102_444_800])
def test_rfc3339_of_whole_seconds_is_the_general_formatting_also_when_asked_again(seconds: int) -> None:
    assert fluxjob.rfc3339(seconds) == _general(seconds)
    assert fluxjob.rfc3339(seconds) == _general(seconds)  # (the second answer comes from the cache)


def test_rfc3339_of_other_times_is_formatted_as_before() -> None:
    for t in (1_764_474_000.4, 1_764_474_000.9999, 12.5):
        assert fluxjob.rfc3339(t) == _general(t)
    assert fluxjob.rfc3339(True) == _general(True)  # a bool is an int subclass: not cached, same text


def test_rfc3339_cache_stays_small() -> None:
    for s in range(1000):
        fluxjob.rfc3339(1_764_474_000 + s)
    assert fluxjob._rfc3339_whole.cache_info().currsize <= 64


class _Res:
    def __init__(self, status: MatchStatus) -> None:
        self.status = status


class _Matcher:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def allocate(self, js: Any, *, now: int = 0, jobid: int | None = None) -> Any:
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    allocate_orelse_reserve = allocate


def _count(outcome: str) -> float:
    return METRICS.match_outcomes.labels(outcome=outcome)._value.get()


def test_timed_matcher_counts_every_outcome_as_the_label_lookup_did() -> None:
    before = {o: _count(o) for o in ("allocated", "busy", "reserved", "error")}
    tm = TimedMatcher(_Matcher([_Res(MatchStatus.ALLOCATED), _Res(MatchStatus.BUSY), _Res(MatchStatus.ALLOCATED),
                                RuntimeError("boom"), _Res(MatchStatus.RESERVED), _Res(MatchStatus.ALLOCATED)]))
    tm.allocate(None)
    tm.allocate(None)
    tm.allocate(None)
    with pytest.raises(RuntimeError):
        tm.allocate(None)
    tm.allocate_orelse_reserve(None)
    tm.allocate(None)
    after = {o: _count(o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {"allocated": 3, "busy": 1, "reserved": 1, "error": 1}


def test_admission_patch_is_the_same_operations_as_json_encoded_them() -> None:
    ops = [{"op": "add", "path": "/spec/template/metadata/labels", "value": {"fluxnetes.io/managed": "true"}},
           {"op": "add", "path": "/metadata/annotations/x~1y", "value": "é ✓ \u2028"}]
    patch = review._response("u", patch=ops)["response"]["patch"]
    assert json.loads(base64.b64decode(patch)) == ops
    assert json.loads(base64.b64decode(patch)) == json.loads(json.dumps(ops))


def _reference_format(record: logging.LogRecord) -> dict[str, Any]:
    """JsonFormatter's fields as it made them before its shortcuts (every value through _jsonable)."""
    out: dict[str, Any] = {"ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
                           "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
    for key, value in flog._bound().items():
        out.setdefault(key, flog._jsonable(value))
    for key, value in vars(record).items():
        if key not in flog._RECORD_ATTRS and not key.startswith("_"):
            out[key] = flog._jsonable(value)
    return out


def test_json_log_lines_are_the_fields_and_order_the_formatter_wrote_before() -> None:
    stream = io.StringIO()
    handler = flog.configure_logging("INFO", "json", stream=stream)
    try:
        log = logging.getLogger("fluxnetes.test.hot_path")
        refs: list[dict[str, Any]] = []  # made as the line is written (inside its log context)
        handler.addFilter(lambda r: refs.append(_reference_format(r)) or True)
        with flog.log_context(job="ns/job-a", group="job-a", namespace="ns", jobid=3):
            log.info("%s: %s -> %s", "ns/job-a", "Pending", "Running",
                     extra={"phase": "Running", "size": 1, "jobid": 17, "nodes": ["n1", "n2"],
                            "shares": {"n1": 2}, "ratio": 0.5, "ok": True, "none": None, "obj": object.__new__(_Res)})
        log.warning("plain line")
        lines = stream.getvalue().splitlines()
        assert [json.loads(line) for line in lines] == refs
        assert [list(json.loads(line)) for line in lines] == [list(r) for r in refs]  # the same key order
        assert json.loads(lines[0])["group"] == "job-a"
        assert json.loads(lines[0])["jobid"] == 17  # a record's own field wins over the context's
    finally:
        logging.getLogger().removeHandler(handler)


def test_the_webhook_sends_no_session_tickets() -> None:
    # the API server's webhook client keeps no TLS session cache (client-go sets none): tickets
    # would be made on every new connection and never used
    import ssl
    from datetime import timedelta

    from fluxnetes.k8s.admission.webhook import ssl_context
    from fluxnetes.k8s.certs import CertBundle, make_ca, make_serving

    now = datetime.now(UTC) - timedelta(minutes=1)
    ca_crt, ca_key = make_ca(now)
    crt, key = make_serving(ca_crt, ca_key, ["localhost"], now)
    server_ctx = ssl_context(CertBundle(ca_crt, ca_key, crt, key))
    client_ctx = ssl.create_default_context(cadata=ca_crt.decode())
    bios = [ssl.MemoryBIO() for _ in range(4)]
    server = server_ctx.wrap_bio(bios[0], bios[1], server_side=True)
    client = client_ctx.wrap_bio(bios[2], bios[3], server_hostname="localhost")
    for _ in range(10):  # the handshake, then one byte each way (tickets follow the handshake)
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        bios[0].write(bios[3].read())
        bios[2].write(bios[1].read())
    server.write(b"x")
    bios[2].write(bios[1].read())
    assert client.read() == b"x"
    assert client.version() == "TLSv1.3"
    assert client.session is not None and not client.session.has_ticket


def test_log_timestamps_are_datetimes_isoformat_to_the_millisecond() -> None:
    import random

    rng = random.Random(31)
    base = 1_764_474_000
    times = [base + rng.random() * 5 for _ in range(5000)]  # (in time order and not: the cache)
    times += [base + s + f for s in range(3) for f in (0.0, 0.0004995, 0.0005, 0.9994999, 0.9995, 0.9999994,
                                                       0.9999995, 0.99999951, 0.9999999)]
    times += [0.0, 0.5, 59.9999996, 86_399.9999996, 4_102_444_799.9999995]
    rng.shuffle(times)
    for t in times:
        assert flog._utc_ms(t) == datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds"), t
