"""Unit level: the webhook reads and writes AdmissionReviews with orjson, as the json module did:
every integer the API server can send (it decodes objects into int64 or float64 first) is read
exactly, NaN is still read, and an answer orjson cannot write is written by the json module."""

from __future__ import annotations

import json
import math

from fluxnetes.k8s.admission.webhook import _dumps, _loads


def test_reviews_read_and_written_as_the_json_module_does() -> None:
    review = {"request": {"uid": "u", "object": {"spec": {"replicas": 3, "note": "é"}}}}
    raw = json.dumps(review).encode()
    assert _loads(raw) == json.loads(raw)
    assert json.loads(_dumps(review)) == review


def test_what_only_the_json_module_handles_still_works() -> None:
    assert math.isnan(_loads(b'{"x": NaN}')["x"])
    for n in (2**63 - 1, -(2**63)):
        assert _loads(json.dumps({"x": n}).encode())["x"] == n
    big = {"x": 2**70}
    assert json.loads(_dumps(big)) == big
