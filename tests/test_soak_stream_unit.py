"""Unit level: the chaos soak's workload stream (fluxnetes.devcluster.soak_stream) against a
fake API (no cluster)."""

from __future__ import annotations

import random
import urllib.error
from typing import Any

from fluxnetes.devcluster import soak_stream
from fluxnetes.devcluster.soak_stream import WORKLOAD_LABEL, Stream, Workload


class FlakyApi:
    """Answers every call, or refuses the connection while ``down`` (an API server restart)."""

    def __init__(self) -> None:
        self.down = False
        self.calls: list[tuple[str, str, Any]] = []

    def api_call(self, method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 0) -> Any:
        if self.down:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        self.calls.append((method, path, body))
        return {}


def running_pods(w: Workload, n: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"{w.name}-{i}", "labels": {WORKLOAD_LABEL: w.id}},
             "spec": {"nodeName": "kwok-node-0"}, "status": {"phase": "Running"}} for i in range(n)]


def test_a_scale_refused_during_an_api_outage_is_made_later_not_assumed(monkeypatch: Any) -> None:
    """The chaos soak judged two Deployments lost (deploy-30, deploy-33): the stream took a
    Deployment's new size before its PATCH, and a PATCH refused while the API server was
    restarting was ignored; the soak then waited for replicas nobody had asked for. Now the
    size changes only once the PATCH went through; until then it is tried again."""
    clock = [0.0]  # the stream's retries sleep: a fake clock instead of seconds of waiting

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(soak_stream.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(soak_stream.time, "sleep", sleep)
    api = FlakyApi()
    s = Stream(api, random.Random(1), ["ns"], max_cpu=2)  # type: ignore[arg-type]
    w = Workload("deploy-1", "deploy", "ns", "deploy-1", 2, 1, 0.0, run_seconds=10, scales=[5])
    s.workloads.append(w)
    deps = [{"metadata": {"name": w.name, "labels": {WORKLOAD_LABEL: w.id}}}]
    s.follow(running_pods(w, 2), [], deps, [], now=100.0)  # fully running from now
    api.down = True
    s.follow(running_pods(w, 2), [], deps, [], now=106.0)  # time to scale: refused
    assert w.size == 2 and w.scales == [5] and w.running_since == 100.0
    api.down = False
    s.follow(running_pods(w, 2), [], deps, [], now=107.0)  # the next pass scales
    assert w.size == 5 and w.scales == [] and w.running_since is None
    assert api.calls == [("PATCH", "/apis/apps/v1/namespaces/ns/deployments/deploy-1", {"spec": {"replicas": 5}})]
