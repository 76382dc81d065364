"""Admission webhook round trip: the dev cluster's apiserver calls a webhook on 127.0.0.1.

This is the path the fluxnetes operator's webhook takes in tests: an HTTPS server with its own
CA (IP SAN 127.0.0.1), registered with `clientConfig.url` + `caBundle`, scoped by a namespace
selector. The configuration is deleted before the cluster is torn down.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fluxnetes.devcluster import Cluster
from fluxnetes.devcluster.pki import issue, new_ca

pytestmark = pytest.mark.k8s

MUTATED_LABEL = "fluxnetes.io/webhook-test"


@dataclass
class WebhookServer:
    url: str
    ca_pem: bytes
    requests: list[dict[str, Any]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = review["request"]
        self.server.seen.append(req)
        labels = req["object"]["metadata"].get("labels")
        patch = (
            [
                {
                    "op": "add",
                    "path": "/metadata/labels/" + MUTATED_LABEL.replace("/", "~1"),
                    "value": "mutated",
                }
            ]
            if labels
            else [{"op": "add", "path": "/metadata/labels", "value": {MUTATED_LABEL: "mutated"}}]
        )
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": req["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[dict[str, Any]]


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[WebhookServer]:
    ca = new_ca("webhook-test-ca")
    leaf = issue(ca, "webhook", ips=["127.0.0.1"], server=True)
    leaf.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.seen = []
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        port = httpd.server_address[1]
        yield WebhookServer(f"https://127.0.0.1:{port}/mutate", ca.cert_pem, httpd.seen)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_apiserver_calls_a_loopback_webhook_and_applies_its_patch(
    k8s_cluster: Cluster, webhook_server: WebhookServer
) -> None:
    k = k8s_cluster
    suffix = uuid.uuid4().hex[:8]
    opted_in, other = f"wh-in-{suffix}", f"wh-out-{suffix}"
    config_name = f"fluxnetes-test-{suffix}"
    k.kubectl("create", "namespace", opted_in)
    k.kubectl("label", "namespace", opted_in, f"{MUTATED_LABEL}=on")
    k.kubectl("create", "namespace", other)
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [
            {
                "name": "label.test.fluxnetes.io",
                "clientConfig": {
                    "url": webhook_server.url,
                    "caBundle": base64.b64encode(webhook_server.ca_pem).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {MUTATED_LABEL: "on"}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
            }
        ],
    }

    def configmap(name: str, ns: str) -> str:
        return json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}
        )

    try:
        k.kubectl("apply", "-f", "-", input=json.dumps(config))
        # the apiserver picks the configuration up through an informer: probe with dry runs
        deadline = time.monotonic() + 60
        while True:
            probe = k.kubectl(
                "create",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
                input=configmap("probe", opted_in),
            )
            if json.loads(probe.stdout)["metadata"].get("labels", {}).get(MUTATED_LABEL):
                break
            assert time.monotonic() < deadline, "webhook configuration never took effect"
            time.sleep(0.5)

        k.kubectl("apply", "-f", "-", input=configmap("real", opted_in))
        got = k.kubectl_json("-n", opted_in, "get", "configmap", "real")
        assert got["metadata"]["labels"][MUTATED_LABEL] == "mutated"
        calls = [r for r in webhook_server.requests if r["name"] == "real" and not r.get("dryRun")]
        assert len(calls) == 1
        assert calls[0]["operation"] == "CREATE" and calls[0]["namespace"] == opted_in

        # outside the namespace selector the webhook is not called and nothing is mutated
        k.kubectl("apply", "-f", "-", input=configmap("real", other))
        untouched = k.kubectl_json("-n", other, "get", "configmap", "real")
        assert MUTATED_LABEL not in (untouched["metadata"].get("labels") or {})
        assert not [r for r in webhook_server.requests if r.get("namespace") == other]
    finally:
        # before the webhook server (and later the cluster) goes away: failurePolicy is Fail
        k.kubectl("delete", "mutatingwebhookconfiguration", config_name, "--ignore-not-found")
        k.kubectl("delete", "namespace", opted_in, other, "--wait=false")
    remaining = k.kubectl_json("get", "mutatingwebhookconfigurations")["items"]
    assert config_name not in {c["metadata"]["name"] for c in remaining}
