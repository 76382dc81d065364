"""The dev cluster's networking helpers: free local ports, whether a port accepts connections,
the address kube-apiserver advertises, and the TLS context for self-signed health endpoints."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess

from fluxnetes.devcluster.errors import ClusterError


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open at once while choosing)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def insecure_context() -> ssl.SSLContext:
    """For the schedulers' and controller-manager's health only: their serving certificates are
    self-signed (each made its own in its --cert-dir)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def advertise_address() -> str:
    """A non-loopback IPv4 of this machine. kube-apiserver rejects loopback for
    --advertise-address; it only lands in the `kubernetes` Service endpoints and is never dialled.
    """
    env = os.environ.get("FLUXNETES_ADVERTISE_ADDRESS")
    if env:
        return env
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for word in out.split():
        if "." in word and not word.startswith("127."):
            return word
    raise ClusterError(
        "no non-loopback IPv4 address found with `hostname -I` (kube-apiserver needs one for "
        "--advertise-address); set FLUXNETES_ADVERTISE_ADDRESS to any address of this machine"
    )

