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
