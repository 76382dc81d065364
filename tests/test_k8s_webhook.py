"""The webhook server over real HTTPS with the operator's own certificate."""

from __future__ import annotations

import base64
import json
import ssl
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from cryptography import x509

from fluxnetes.k8s import certs, names
from fluxnetes.k8s.admission import webhook_config
from fluxnetes.k8s.admission.webhook import WebhookServer


def test_bundle_has_ip_san_and_renews() -> None:
    b = certs.make_bundle(["127.0.0.1", "fluxnetes.fluxnetes-system.svc"])
    cert = x509.load_pem_x509_certificate(b.tls_crt)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert not certs.needs_renewal(b, ["127.0.0.1"])
    assert certs.needs_renewal(b, ["10.0.0.9"])
    assert certs.needs_renewal(b, ["127.0.0.1"], now=datetime.now(UTC) + timedelta(days=340))
    r = certs.renew(b, ["127.0.0.1", "10.0.0.9"])
    assert r.ca_crt == b.ca_crt and r.tls_crt != b.tls_crt
    assert certs.CertBundle.from_secret_data(r.as_secret_data()) == r


def test_webhook_config_scope() -> None:
    target = webhook_config.WebhookTarget(url="https://127.0.0.1:9443")
    scope = webhook_config.Scope(own_namespace="flux-ns")
    m = webhook_config.mutating(target, scope, b"CA")
    pods = m["webhooks"][0]
    assert pods["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate-pods"
    assert base64.b64decode(pods["clientConfig"]["caBundle"]) == b"CA"
    # the outage story: opted-in namespaces refuse what would bypass the queue, nothing else is called
    assert pods["failurePolicy"] == "Fail" and m["webhooks"][1]["failurePolicy"] == "Fail"
    exprs = pods["namespaceSelector"]["matchExpressions"]
    assert exprs[0] == {"key": names.LABEL_ENABLED, "operator": "In", "values": ["true"]}
    assert {"kube-system", "flux-ns"} <= set(exprs[1]["values"])
    # pods born gated (from a template the workload webhook mutated) and opted-out pods skip the
    # pod webhook unless bound by hand (matchConditions, CEL: checked on the real API server by
    # tests/test_k8s_outage.py)
    assert "objectSelector" not in pods
    cond = pods["matchConditions"][0]["expression"]
    assert "object.spec.nodeName" in cond and names.LABEL_MANAGED in cond and names.LABEL_ENABLED in cond
    assert m["webhooks"][1]["objectSelector"] == {"matchExpressions": [
        {"key": names.LABEL_ENABLED, "operator": "NotIn", "values": ["false"]}]}
    every = webhook_config.mutating(target, webhook_config.Scope(admit_template_pods=True), b"CA")
    assert names.LABEL_MANAGED not in every["webhooks"][0]["matchConditions"][0]["expression"]
    ignore = webhook_config.mutating(target, webhook_config.Scope(failure_policy="Ignore"), b"CA")
    assert {w["failurePolicy"] for w in ignore["webhooks"]} == {"Ignore"}
    v = webhook_config.validating(target, scope, b"CA")
    assert v["webhooks"][0]["objectSelector"] == webhook_config.gated_pods_selector()
    # guards updates only: kube-controller-manager must update pods (finalizers) during an outage
    assert v["webhooks"][0]["failurePolicy"] == "Ignore"
    svc = webhook_config.WebhookTarget(service_name="fluxnetes", service_namespace="flux-ns")
    assert svc.client_config("/x", b"")["service"]["path"] == "/x"


@pytest.mark.asyncio
async def test_webhook_serves_reviews_over_tls() -> None:
    bundle = certs.make_bundle(["127.0.0.1"])
    server = WebhookServer("127.0.0.1", 0, bundle, lambda: {"operator"})
    port = await server.start()
    ctx = ssl.create_default_context(cadata=bundle.ca_crt.decode())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c"}]},
    }
    review = {
        "request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod}
    }
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"https://127.0.0.1:{port}/mutate-pods", json=review, ssl=ctx) as r:
                body = await r.json()
            assert body["response"]["uid"] == "u" and body["response"]["allowed"]
            patch = json.loads(base64.b64decode(body["response"]["patch"]))
            assert {
                "op": "add",
                "path": "/spec/schedulingGates",
                "value": [{"name": names.GATE}],
            } in patch
            gated = {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": names.GATE}]}}
            upd = {
                "request": {
                    "uid": "v",
                    "operation": "UPDATE",
                    "object": pod,
                    "oldObject": gated,
                    "userInfo": {"username": "bob"},
                }
            }
            async with s.post(f"https://127.0.0.1:{port}/validate-pods", json=upd, ssl=ctx) as r:
                assert (await r.json())["response"]["allowed"] is False
            async with s.post(f"https://127.0.0.1:{port}/mutate-pods", data=b"[1", ssl=ctx) as r:
                assert r.status == 400
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_webhook_in_its_own_process() -> None:
    bundle = certs.make_bundle(["127.0.0.1"])
    server = WebhookServer("127.0.0.1", 0, bundle, lambda: {"operator"})
    port = await server.start_in_process()
    ctx = ssl.create_default_context(cadata=bundle.ca_crt.decode())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
           "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": names.GATE}]}}
    upd = {"request": {"uid": "v", "operation": "UPDATE", "object": {**pod, "spec": {"containers": []}},
                       "oldObject": pod, "userInfo": {"username": "operator"}}}
    try:
        async with aiohttp.ClientSession() as s, s.post(
            f"https://127.0.0.1:{port}/validate-pods", json=upd, ssl=ctx
        ) as r:
            assert (await r.json())["response"]["allowed"] is True  # the operator's identity
    finally:
        await server.stop()


def test_gate_policy_is_cel_with_the_operator_identity() -> None:
    scope = webhook_config.Scope(own_namespace="flux-ns")
    policy, binding = webhook_config.gate_policy(scope, ["system:serviceaccount:flux-ns:fluxnetes"])
    rule = policy["spec"]["validations"][0]
    assert '"system:serviceaccount:flux-ns:fluxnetes"' in rule["expression"]
    assert names.GATE in rule["expression"] and names.GATE in rule["messageExpression"]
    # fluxnetes' pods but the ones held by the scheduler name only (no gate to guard)
    assert policy["spec"]["matchConstraints"]["objectSelector"] == {"matchExpressions": [
        {"key": names.LABEL_MANAGED, "operator": "In", "values": ["true"]},
        {"key": names.LABEL_HOLD, "operator": "NotIn", "values": [names.HOLD_SCHEDULER_NAME]}]}
    label_rule = policy["spec"]["validations"][1]
    assert names.LABEL_HOLD in label_rule["expression"] and '"system:serviceaccount:flux-ns:fluxnetes"' in label_rule["expression"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio
async def test_operators_of_two_clusters_never_share_a_webhook_port() -> None:
    """Issue #29 item 7: two clusters' operators on one host with one --webhook-port. The second
    must not bind beside the first (SO_REUSEPORT would let the kernel hand it the first
    cluster's admission calls), even when both ask to share: its CA did not sign the holder's
    certificate. It stops with an error naming the port; the first keeps the port alone."""
    from fluxnetes.k8s.admission.webhook import WebhookPortError

    port = _free_port()
    one, other = certs.make_bundle(["127.0.0.1"]), certs.make_bundle(["127.0.0.1"])
    first = WebhookServer("127.0.0.1", port, one, lambda: {"operator"}, share_port=True)
    await first.start_in_process()
    try:
        for share in (False, True):
            second = WebhookServer("127.0.0.1", port, other, lambda: {"operator"}, share_port=share)
            with pytest.raises(WebhookPortError, match=f"--webhook-port {port} is held by a process"):
                await second.start_in_process()
        # every connection still reaches the first cluster's operator
        ctx = ssl.create_default_context(cadata=one.ca_crt.decode())
        async with aiohttp.ClientSession() as s:
            for _ in range(20):
                async with s.get(f"https://127.0.0.1:{port}/healthz", ssl=ctx) as r:
                    assert r.status == 200
    finally:
        await first.stop()


@pytest.mark.asyncio
async def test_a_taken_port_is_an_error_unless_replicas_of_one_operator_ask_to_share() -> None:
    from fluxnetes.k8s.admission.webhook import WebhookPortError

    port = _free_port()
    bundle = certs.make_bundle(["127.0.0.1"])
    first = WebhookServer("127.0.0.1", port, bundle, lambda: {"operator"}, share_port=True)
    await first.start_in_process()
    second = WebhookServer("127.0.0.1", port, bundle, lambda: {"operator"})
    try:
        with pytest.raises(WebhookPortError, match="--webhook-share-port"):
            await second.start_in_process()  # a replica, but it did not ask to share
        second = WebhookServer("127.0.0.1", port, bundle, lambda: {"operator"}, share_port=True)
        assert await second.start_in_process() == port  # same CA (same Secret), both asked
        await first.stop()  # the kernel sends new connections to the replica left
        ctx = ssl.create_default_context(cadata=bundle.ca_crt.decode())
        async with aiohttp.ClientSession() as s, s.get(f"https://127.0.0.1:{port}/healthz", ssl=ctx) as r:
            assert r.status == 200
    finally:
        await first.stop()
        await second.stop()


@pytest.mark.asyncio
async def test_a_port_held_without_sharing_is_never_joined() -> None:
    """A replica that did not ask to share holds the port alone: a second one that asks gets
    an error (the kernel refuses it too), not a half-shared port."""
    from fluxnetes.k8s.admission.webhook import WebhookPortError

    port = _free_port()
    bundle = certs.make_bundle(["127.0.0.1"])
    first = WebhookServer("127.0.0.1", port, bundle, lambda: {"operator"})
    await first.start_in_process()
    try:
        second = WebhookServer("127.0.0.1", port, bundle, lambda: {"operator"}, share_port=True)
        with pytest.raises(WebhookPortError, match=f"--webhook-port {port} is in use"):
            await second.start_in_process()
    finally:
        await first.stop()
