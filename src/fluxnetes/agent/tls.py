"""Mutual TLS between agents, with certificates from the operator's CA.

Layout of a certificate directory (``--cert-dir``): ``ca.crt`` always; either ``tls.crt`` +
``tls.key`` (a certificate made for this agent) or ``ca.key`` (the operator's CA key, as the
chart mounts it from the operator's ``<release>-webhook-cert`` Secret), from which the agent
issues itself a certificate at start: CN = its node name, organisation ``fluxnetes:agent``,
its addresses as SANs, valid for both server and client use.

Connections are checked by name, not by address: a child's HELLO must name the CN of the
certificate it presented, and a parent's certificate must carry the CN of the member the child
meant to reach. Human clients (``kubectl fluxnetes nodes exec --address``) present a
certificate with organisation ``fluxnetes:client`` from the same CA, or no certificate and a
bearer token (see :mod:`fluxnetes.agent.authz`).
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

AGENT_ORG = "fluxnetes:agent"
CLIENT_ORG = "fluxnetes:client"


class CertError(Exception):
    """Missing or unusable certificate material; the message names the file."""


@dataclass(frozen=True)
class CertPaths:
    ca_crt: Path
    crt: Path
    key: Path


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def make_ca(directory: Path, cn: str = "fluxnetes-agent-test-ca") -> Path:
    """A fresh CA (ca.crt, ca.key) in ``directory`` (tests and local trials; in a cluster the
    agents use the operator's CA, made the same way by fluxnetes.k8s.certs)."""
    from fluxnetes.k8s.certs import make_ca as new_ca

    directory.mkdir(parents=True, exist_ok=True)
    crt, key = new_ca(datetime.now(UTC), cn)
    (directory / "ca.crt").write_bytes(crt)
    (directory / "ca.key").write_bytes(key)
    (directory / "ca.key").chmod(0o600)
    return directory


def issue(ca_dir: Path, out_dir: Path, cn: str, *, org: str = AGENT_ORG,
          hosts: tuple[str, ...] = ("127.0.0.1",), days: int = 365) -> CertPaths:
    """Sign a server+client certificate for ``cn`` with the CA in ``ca_dir``; write it to ``out_dir``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    try:
        ca_pem = (ca_dir / "ca.crt").read_bytes()
        ca_key_pem = (ca_dir / "ca.key").read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the CA in {ca_dir} (ca.crt and ca.key): {exc}") from None
    ca = x509.load_pem_x509_certificate(ca_pem)
    signer = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        from cryptography.hazmat.primitives.asymmetric import rsa

        if not isinstance(signer, rsa.RSAPrivateKey):
            raise CertError(f"{ca_dir / 'ca.key'}: only EC and RSA CA keys are supported")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(cn)]
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                                 x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(out_dir / "ca.crt", out_dir / "tls.crt", out_dir / "tls.key")
    if paths.ca_crt.resolve() != (ca_dir / "ca.crt").resolve():
        paths.ca_crt.write_bytes(ca_pem)
    paths.crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(_key_pem(key))
    paths.key.chmod(0o600)
    return paths


def agent_certs(cert_dir: Path, state_dir: Path, node: str, hosts: tuple[str, ...]) -> CertPaths:
    """The agent's certificate: given in ``cert_dir``, or issued from its ``ca.key`` into ``state_dir``."""
    if not (cert_dir / "ca.crt").is_file():
        raise CertError(f"--cert-dir {cert_dir}: ca.crt is missing (the operator's CA certificate)")
    if (cert_dir / "tls.crt").is_file() and (cert_dir / "tls.key").is_file():
        return CertPaths(cert_dir / "ca.crt", cert_dir / "tls.crt", cert_dir / "tls.key")
    if (cert_dir / "ca.key").is_file():
        return issue(cert_dir, state_dir / "tls", node, hosts=hosts)
    raise CertError(f"--cert-dir {cert_dir}: needs tls.crt + tls.key, or ca.key to issue them")


def server_context(paths: CertPaths) -> ssl.SSLContext:
    """Verifies a client certificate when one is presented (agents, certificate clients);
    clients without one may still connect and must then authenticate with a token."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(paths.ca_crt))
    ctx.load_cert_chain(str(paths.crt), str(paths.key))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(paths: CertPaths | None, ca_crt: Path | None = None) -> ssl.SSLContext:
    """For an agent (``paths``) or a human client; names are checked by CN after connecting."""
    ca = paths.ca_crt if paths else ca_crt
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
    ctx.check_hostname = False
    if ca is None:
        # only through an already authenticated tunnel (kubectl port-forward): see docs/agent.md
        ctx.verify_mode = ssl.CERT_NONE
    if paths:
        ctx.load_cert_chain(str(paths.crt), str(paths.key))
    return ctx


def peer_identity(peercert: Any) -> tuple[str, str] | None:
    """(CN, O) of a verified peer certificate (``getpeercert()``), or None when there is none."""
    if not peercert:
        return None
    cn = org = ""
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationName":
                org = value
    return cn, org
