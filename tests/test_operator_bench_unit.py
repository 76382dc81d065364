"""bench/operator_bench.py's pure helpers: the baseline-corrected CPU per pod (the idle
windows' rate x the run's length taken off each component) and the no-webhook variant's Job."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "operator_bench.py"


@pytest.fixture(scope="module")
def ob() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_idle_rate_times_run_length_is_taken_off_each_component(ob: ModuleType) -> None:
    run = {"component_cpu_seconds": {"kube-apiserver": 10.0, "etcd": 2.0}, "operator_cpu_seconds": 3.0}
    before = {"kube-apiserver": 0.5, "etcd": 0.1, "operator": 0.05}
    after = {"kube-apiserver": 0.3, "etcd": 0.1, "operator": 0.05}
    ob.baseline_corrected(run, [before, after], 10.0, 100)
    assert run["cpu_ms_per_pod_raw"] == {"kube-apiserver": 100.0, "etcd": 20.0, "operator": 30.0}
    # mean idle rate 0.4 cpu-s/s over 10 s: 4 s of the API server's 10 were background
    assert run["cpu_ms_per_pod_corrected"] == {"kube-apiserver": 60.0, "etcd": 10.0, "operator": 25.0}
    assert run["idle_cpu_rates"]["kube-apiserver"] == 0.4 and run["measured_seconds"] == 10.0


def test_a_run_without_operator_gets_no_operator_figure(ob: ModuleType) -> None:
    run = {"component_cpu_seconds": {"kube-apiserver": 1.0}}
    ob.baseline_corrected(run, [{"kube-apiserver": 0.0}], 5.0, 10)
    assert set(run["cpu_ms_per_pod_corrected"]) == {"kube-apiserver"}
    assert run["cpu_ms_per_pod_corrected"]["kube-apiserver"] == 100.0


def test_named_variant_job_names_fluxnetes_in_its_pod_template(ob: ModuleType) -> None:
    assert ob.job_body("j", 10, "fluxnetes")["spec"]["template"]["spec"]["schedulerName"] == "fluxnetes"
    assert "schedulerName" not in ob.job_body("j", 10)["spec"]["template"]["spec"]


def test_evidence_is_the_runs_difference_of_the_api_servers_counters(ob: ModuleType) -> None:
    metrics = """apiserver_terminated_watchers_total{group="",resource="pods"} 3
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 90
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="true",flow_schema="a",priority_level="workload-low"} 0.5
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="true",flow_schema="a",priority_level="workload-low"} 10
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="false",flow_schema="a",priority_level="workload-low"} 7
etcd_request_duration_seconds_sum{group="",operation="create",resource="pods"} 2.0
etcd_request_duration_seconds_count{group="",operation="create",resource="pods"} 40
etcd_request_duration_seconds_sum{group="",operation="get",resource="pods"} 1.0
etcd_request_duration_seconds_count{group="",operation="get",resource="pods"} 60
etcd_request_duration_seconds_sum{group="",operation="get",resource="nodes"} 0.0
etcd_request_duration_seconds_count{group="",operation="get",resource="nodes"} 100
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 99
"""

    class FakeKube:
        async def request_text(self, path: str) -> str:
            assert path == "/metrics"
            return metrics

    import asyncio

    after = asyncio.run(ob.evidence_counters(FakeKube()))
    before = {"terminated_watchers pods": 1.0, "apf_dispatched exempt": 40.0, "watch_requests pods": 2.0}
    e = ob.evidence(before, after, 20.0, (1_000_000.0, 11_000_000.0), 0)
    assert e["terminated_watchers"] == {"pods": 2}
    assert e["apf_dispatched"] == {"exempt": 50}
    assert e["apf_wait_ms"] == {"workload-low": {"mean": 50.0, "requests": 10}}  # executed only
    assert e["etcd_ms"]["pods"] == {"mean": 30.0, "requests": 100}  # all operations on pods
    assert e["etcd_ms"]["all"] == {"mean": 15.0, "requests": 200}
    assert e["watch_requests"] == {"pods": 2}  # (POSTs are not watches)
    assert e["cpu_pressure_some_pct"] == 50.0 and e["operator_watch_restarts"] == 0
