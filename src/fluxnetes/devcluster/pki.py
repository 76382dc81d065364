"""A tiny certificate authority (cryptography package): the dev cluster's PKI and test webhooks.

ECDSA P-256 keys: fast to generate and accepted by every Kubernetes component (serving,
client certificates and service-account token signing).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM, the form every Kubernetes component reads."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class CertKey:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _private_key_pem(self.key)

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _now() -> datetime.datetime:
    # backdated a little so a clock skew between processes never makes a fresh cert "not yet valid"
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.CertificateBuilder:
    """What a CA and a leaf certificate share: names, key, serial, validity, basic constraints
    and key usage (a CA also signs certificates and CRLs)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def new_ca(common_name: str) -> CertKey:
    key = new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKey(cert, key)


def issue(
    ca: CertKey,
    common_name: str,
    *,
    organizations: Sequence[str] = (),
    ips: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
) -> CertKey:
    """A leaf certificate signed by `ca`. Serving certs need SANs: Go ignores the CN."""
    if not (server or client):
        raise ValueError("issue(): a certificate must be for server and/or client use")
    key = new_key()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        _builder(_name(common_name, organizations), ca.cert.subject, key, ca=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(d) for d in dns_names]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return CertKey(builder.sign(ca.key, hashes.SHA256()), key)


@dataclass(frozen=True)
class ClusterPKI:
    """Files the control plane reads; all under one directory."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def write_cluster_pki(directory: Path, advertise_ip: str, service_ip: str) -> ClusterPKI:
    """CA, apiserver serving cert, admin client cert (system:masters), service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = ClusterPKI(directory)
    ca = new_ca("fluxnetes-dev-ca")
    ca.write(pki.ca_crt, pki.ca_key)
    issue(
        ca,
        "kube-apiserver",
        ips=sorted({"127.0.0.1", advertise_ip, service_ip}),
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        server=True,
    ).write(pki.apiserver_crt, pki.apiserver_key)
    issue(ca, "kubernetes-admin", organizations=["system:masters"], client=True).write(
        pki.admin_crt, pki.admin_key
    )
    sa = new_key()
    pki.sa_key.write_bytes(_private_key_pem(sa))
    pki.sa_key.chmod(0o600)
    pki.sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def load_ca(pki: ClusterPKI) -> CertKey:
    """The cluster CA written by write_cluster_pki (to issue more certificates from it)."""
    cert = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key} is not an ECDSA key")
    return CertKey(cert, key)


def write_serving_cert(pki: ClusterPKI, common_name: str, directories: Sequence[Path],
                       ips: Sequence[str] = ("127.0.0.1",), dns_names: Sequence[str] = ("localhost",)) -> None:
    """A serving certificate from the cluster CA, written as tls.crt / tls.key (the names
    controller-runtime's webhook and metrics servers read) into each of ``directories``."""
    leaf = issue(load_ca(pki), common_name, ips=ips, dns_names=dns_names, server=True)
    for d in directories:
        d.mkdir(parents=True, exist_ok=True)
        leaf.write(d / "tls.crt", d / "tls.key")
