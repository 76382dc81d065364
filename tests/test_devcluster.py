"""Unit tests of the dev cluster's parts that need no control plane (shapes, PKI, processes, CLI)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import typer
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from fluxnetes.cli import dev_cmd
from fluxnetes.devcluster import (
    GPU_RESOURCE,
    RACK_LABEL,
    ZONE_LABEL,
    BinariesMissing,
    Cluster,
    ClusterError,
    ClusterOptions,
    NodeShape,
    NodeSpecError,
    free_ports,
    port_open,
    procs,
    toolchain,
)
from fluxnetes.devcluster import pki as pkimod
from fluxnetes.devcluster.nodes import is_ready
from fluxnetes.devcluster.paths import BINARIES
from fluxnetes.devcluster.state import ClusterState
from helpers import cli_app


# -- node shapes -------------------------------------------------------------------------------
def test_manifest_carries_capacity_labels_and_kwok_annotation() -> None:
    node = NodeShape(count=2, cpu="8", memory="32Gi", gpus=4).validate().manifest(1)
    assert node["metadata"]["name"] == "kwok-node-1"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    expected = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU_RESOURCE: "4"}
    assert node["status"]["capacity"] == expected
    assert node["status"]["allocatable"] == expected
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-node-1"


def test_no_gpu_resource_without_gpus() -> None:
    assert GPU_RESOURCE not in NodeShape(count=1).manifest(0)["status"]["capacity"]


def test_nodes_fill_racks_in_order_and_racks_belong_to_their_zone() -> None:
    shape = NodeShape(count=12, zones=2, racks=3)
    places = [shape.placement(i) for i in range(12)]
    assert places[:2] == [("zone-0", "rack-0")] * 2
    assert places[-2:] == [("zone-1", "rack-5")] * 2
    racks_per_zone: dict[str, set[str]] = {}
    for zone, rack in places:
        racks_per_zone.setdefault(zone, set()).add(rack)
    assert racks_per_zone == {
        "zone-0": {"rack-0", "rack-1", "rack-2"},
        "zone-1": {"rack-3", "rack-4", "rack-5"},
    }
    labels = shape.manifest(11)["metadata"]["labels"]
    assert (labels[ZONE_LABEL], labels[RACK_LABEL]) == ("zone-1", "rack-5")


def test_uneven_spread_still_uses_every_rack_when_nodes_suffice() -> None:
    shape = NodeShape(count=7, zones=2, racks=2)
    racks = [shape.placement(i)[1] for i in range(7)]
    assert set(racks) == {"rack-0", "rack-1", "rack-2", "rack-3"}
    assert racks == sorted(racks)  # contiguous blocks


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        (NodeShape(count=-1), "--nodes"),
        (NodeShape(cpu="lots"), "--cpu"),
        (NodeShape(memory="12 GB"), "--memory"),
        (NodeShape(gpus=-2), "--gpus"),
        (NodeShape(zones=0), "--zones"),
        (NodeShape(racks=0), "--racks"),
        (NodeShape(pods=0), "--pods"),
        (NodeShape(prefix="Bad_Name"), "prefix"),
    ],
)
def test_bad_shapes_are_rejected_naming_the_option(shape: NodeShape, fragment: str) -> None:
    with pytest.raises(NodeSpecError, match=fragment):
        shape.validate()


@pytest.mark.parametrize("qty", ["1", "500m", "2.5", "64Gi", "1Ti", "128M"])
def test_valid_quantities_pass(qty: str) -> None:
    NodeShape(cpu=qty, memory=qty).validate()


def test_is_ready_needs_ready_condition_and_no_not_ready_taint() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}, "spec": {}}
    assert is_ready(ready)
    tainted = {
        **ready,
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
    }
    assert not is_ready(tainted)
    assert not is_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not is_ready({})


# -- PKI ---------------------------------------------------------------------------------------
def test_cluster_pki_chain_sans_and_admin_group(tmp_path: Path) -> None:
    pki = pkimod.write_cluster_pki(tmp_path, "192.0.2.7", "10.0.0.1")
    ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    srv = x509.load_pem_x509_certificate(pki.apiserver_crt.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_crt.read_bytes())
    srv.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert ips == {"127.0.0.1", "192.0.2.7", "10.0.0.1"}
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    orgs = [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    eku = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert ca.not_valid_before_utc < datetime.datetime.now(datetime.UTC)
    assert oct(pki.ca_key.stat().st_mode & 0o777) == "0o600"
    assert b"PUBLIC KEY" in pki.sa_pub.read_bytes()


def test_issue_refuses_a_certificate_without_a_use() -> None:
    with pytest.raises(ValueError, match="server and/or client"):
        pkimod.issue(pkimod.new_ca("x"), "leaf")


def test_issued_serving_cert_works_for_a_real_tls_handshake(tmp_path: Path) -> None:
    ca = pkimod.new_ca("test-ca")
    leaf = pkimod.issue(ca, "srv", ips=["127.0.0.1"], server=True)
    leaf.write(tmp_path / "s.crt", tmp_path / "s.key")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(b"ok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.recv(2) == b"ok"
    t.join(5)
    listener.close()
    assert isinstance(leaf.key, ec.EllipticCurvePrivateKey)
    assert ipaddress.ip_address("127.0.0.1") in leaf.cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.IPAddress)


# -- ports and processes -----------------------------------------------------------------------
def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    for p in ports:
        assert not port_open(p)
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_spawned_process_is_recognised_and_stopped_by_pid(tmp_path: Path) -> None:
    popen, rec = procs.spawn(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "l.log",
        cwd=tmp_path,
    )
    assert procs.is_running(rec)
    assert procs.stop([rec], timeout=5) == []
    assert not procs.is_running(rec)
    assert popen.wait(5) is not None


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    popen, rec = procs.spawn(
        "stubborn", [sys.executable, "-c", code], tmp_path / "l.log", cwd=tmp_path
    )
    # SIGTERM must come after the child ignores it: a slow start is waited for, not raced
    deadline = time.monotonic() + 120
    while "up" not in (tmp_path / "l.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "up" in (tmp_path / "l.log").read_text(), "the child never started"
    assert procs.stop([rec], timeout=0.5) == ["stubborn"]
    assert not procs.is_running(rec)
    popen.wait(5)


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    popen, rec = procs.spawn(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "l.log",
        cwd=tmp_path,
    )
    impostor = procs.ProcessRecord("old", rec.pid, rec.start_ticks - 1, rec.log)
    assert not procs.is_running(impostor)
    procs.stop([impostor], timeout=1)
    assert procs.is_running(rec)  # the real process was left alone
    procs.stop([rec], timeout=5)
    popen.wait(5)


def test_a_wait_names_the_process_that_exited_with_its_log(tmp_path: Path) -> None:
    popen, alive = procs.spawn(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "a.log",
        cwd=tmp_path,
    )
    log = tmp_path / "d.log"
    log.write_text("starting\nfatal: bad flag\n")
    dead = procs.ProcessRecord("kwok", alive.pid, alive.start_ticks - 1, str(log))  # pid reused
    try:
        procs.raise_if_exited([alive], "the nodes")  # all running: no error
        with pytest.raises(ClusterError, match=r"(?s)kwok exited while waiting for the nodes.*bad flag"):
            procs.raise_if_exited([alive, dead], "the nodes")
    finally:
        procs.stop([alive], timeout=5)
        popen.wait(5)


def test_state_file_round_trip() -> None:
    st = ClusterState(
        dir="/x",
        kubeconfig="/x/kubeconfig",
        api_url="https://127.0.0.1:1",
        ports={"apiserver": 1},
        advertise_address="192.0.2.1",
        data_dir="/dev/shm/fluxnetes-etcd-1",
        processes=[procs.ProcessRecord("etcd", 10, 20, "/x/logs/etcd.log")],
    )
    assert ClusterState.from_json(st.to_json()) == st
    bad = json.loads(st.to_json())
    bad["version"] = 99
    with pytest.raises(ClusterError, match="version"):
        ClusterState.from_json(json.dumps(bad))


def test_up_without_binaries_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(BinariesMissing, match=r"hack/build-k8s\.sh"):
        Cluster.up(ClusterOptions(k8s_home=tmp_path / "nothing", dir=tmp_path / "c"))
    assert toolchain(tmp_path / "nothing").missing()


def test_attach_without_a_cluster_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no dev cluster in"):
        Cluster.attach(tmp_path)


# -- CLI (its own app: only the `dev` group is under test here) --------------------------------
def _app() -> typer.Typer:
    return cli_app(dev_cmd)


def test_cli_rejects_bad_options_without_traceback(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        _app(), ["dev", "cluster", "up", "--cpu", "many", "--dir", str(tmp_path)]
    )
    assert res.exit_code == 2
    assert "--cpu must be a Kubernetes quantity" in res.output
    assert "Traceback" not in res.output


def test_cli_up_reports_missing_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUXNETES_K8S_HOME", str(tmp_path / "empty"))
    res = CliRunner().invoke(_app(), ["dev", "cluster", "up", "--dir", str(tmp_path / "c")])
    assert res.exit_code == 1
    assert "binaries missing" in res.output and "build-k8s.sh" in res.output


def test_cli_status_and_down_without_a_cluster(tmp_path: Path) -> None:
    res = CliRunner().invoke(_app(), ["dev", "cluster", "status", "--dir", str(tmp_path)])
    assert res.exit_code == 3
    assert "no dev cluster" in res.output
    res = CliRunner().invoke(_app(), ["dev", "cluster", "down", "--dir", str(tmp_path)])
    assert res.exit_code == 0
    assert "nothing to stop" in res.output


def test_cli_build_with_everything_present_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "k8s"
    tools = toolchain(home)
    tools.bin_dir.mkdir(parents=True)
    for name in BINARIES:
        exe = tools.binary(name)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    for stage in tools.stage_files:
        stage.parent.mkdir(parents=True, exist_ok=True)
        stage.write_text("")
    monkeypatch.setenv("FLUXNETES_K8S_HOME", str(home))
    res = CliRunner().invoke(_app(), ["dev", "build"])
    assert res.exit_code == 0, res.output
    assert "all binaries present" in res.output


def test_dev_cluster_help_lists_the_commands() -> None:
    res = CliRunner().invoke(_app(), ["dev", "cluster", "--help"])
    assert res.exit_code == 0
    for cmd in ("up", "down", "status"):
        assert cmd in res.output
    # the module keeps heavy imports inside the commands
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fluxnetes.cli.dev_cmd; print('aiohttp' in sys.modules, 'cryptography' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    ).stdout.split()
    assert out == ["False", "False"]


def test_untaint_patch_only_lifts_not_ready_and_guards_concurrent_changes() -> None:
    from fluxnetes.devcluster.readiness import untaint_request

    taints = [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    ]
    req = untaint_request({"metadata": {"name": "n1"}, "spec": {"taints": taints}})
    assert (req.method, req.path) == ("PATCH", "/api/v1/nodes/n1")
    assert req.content_type == "application/json-patch+json"
    assert req.body == [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": [taints[1]]},
    ]
    assert 422 in req.ignore  # a failed test op means someone else changed the taints


def test_pod_duration_option_is_checked_and_sets_the_untimed_stage_delay() -> None:
    """`dev cluster up --pod-duration` (issue #29 item 8): a bad value names the option; a good
    one gives Job pods without the annotation that delay in kwok's stages, while annotated
    pods keep reading theirs."""
    import yaml

    from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION, timed_stages

    res = CliRunner().invoke(cli_app(dev_cmd), ["dev", "cluster", "up", "--pod-duration", "soon"])
    assert res.exit_code == 2 and "--pod-duration='soon'" in res.output
    untimed, timed = yaml.safe_load_all(timed_stages(90))
    assert untimed["spec"]["delay"] == {"durationMilliseconds": 90_000}
    assert timed["spec"]["delay"]["durationFrom"]["expressionFrom"] == (
        f'.metadata.annotations["{TIMED_POD_ANNOTATION}"]')
    assert timed["spec"]["delay"] != {"durationMilliseconds": 90_000}
    untimed, _ = yaml.safe_load_all(timed_stages(0))
    assert "delay" not in untimed["spec"]  # at once, as before
