"""The webhook's own certificate authority and serving certificate (no cert-manager).

ECDSA P-256 keys: fast to make, accepted by the API server (Go's TLS). The CA lives for
ten years, the serving certificate for one; the operator renews the serving certificate when
less than 30 days remain. Everything is kept in one Secret so that all replicas serve with
the same certificate and the webhook configuration's caBundle stays valid across restarts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class CertBundle:
    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    def as_secret_data(self) -> dict[str, bytes]:
        return {"ca.crt": self.ca_crt, "ca.key": self.ca_key, "tls.crt": self.tls_crt, "tls.key": self.tls_key}

    @classmethod
    def from_secret_data(cls, data: dict[str, bytes]) -> CertBundle:
        return cls(data["ca.crt"], data["ca.key"], data["tls.crt"], data["tls.key"])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(now: datetime, cn: str = "fluxnetes-webhook-ca") -> tuple[bytes, bytes]:
    """A self-signed CA (certificate, key; PEM), valid ten years."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_serving(ca_crt: bytes, ca_key: bytes, hosts: list[str], now: datetime) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_crt)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_bundle(hosts: list[str], now: datetime | None = None) -> CertBundle:
    now = now or datetime.now(UTC)
    ca_crt, ca_key = make_ca(now)
    return CertBundle(ca_crt, ca_key, *make_serving(ca_crt, ca_key, hosts, now))


def needs_renewal(bundle: CertBundle, hosts: list[str], now: datetime | None = None) -> bool:
    """True when the serving certificate expires soon or does not cover ``hosts``."""
    now = now or datetime.now(UTC)
    cert = x509.load_pem_x509_certificate(bundle.tls_crt)
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return True
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    return not set(hosts) <= have


def renew(bundle: CertBundle, hosts: list[str], now: datetime | None = None) -> CertBundle:
    """New serving certificate from the same CA (the caBundle in the API server stays valid)."""
    now = now or datetime.now(UTC)
    ca = x509.load_pem_x509_certificate(bundle.ca_crt)
    if ca.not_valid_after_utc - now < RENEW_BEFORE:
        return make_bundle(hosts, now)
    return CertBundle(bundle.ca_crt, bundle.ca_key, *make_serving(bundle.ca_crt, bundle.ca_key, hosts, now))
