"""The dev cluster DNS's little client (devcluster/dns.py `query`): what `up` waits with and the
real-node tests ask. Answered here by a one-shot UDP server on 127.0.0.1 with hand-made replies."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from fluxnetes.devcluster import dns
from fluxnetes.devcluster.errors import ClusterError


def _serve_once(reply: bytes | None, rcode: int = 0) -> int:
    """Answer the next question with `reply` as answer section (a CNAME-free A list) and rcode;
    returns the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)

    def run() -> None:
        with sock:
            msg, peer = sock.recvfrom(512)
            qid = msg[:2]
            question = msg[12:]
            answers = reply or b""
            count = answers.count(b"\xc0\x0c")  # one compressed name per record
            header = qid + struct.pack(">HHHHH", 0x8180 | rcode, 1, count, 0, 0)
            sock.sendto(header + question + answers, peer)

    threading.Thread(target=run, daemon=True).start()
    return int(sock.getsockname()[1])


def _a(ip: str) -> bytes:
    # name = pointer to the question's name (offset 12), type A, class IN, ttl 5, 4 bytes
    return b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)


def test_query_reads_compressed_a_records() -> None:
    port = _serve_once(_a("10.0.0.1") + _a("10.0.0.2"))
    assert dns.query("127.0.0.1", "kubernetes.default.svc.cluster.local", port=port) == ["10.0.0.1", "10.0.0.2"]


def test_query_nxdomain_is_empty_and_refused_is_an_error() -> None:
    assert dns.query("127.0.0.1", "nothing.cluster.local", port=_serve_once(None, rcode=3)) == []
    with pytest.raises(ClusterError, match="rcode 5"):
        dns.query("127.0.0.1", "example.org", port=_serve_once(None, rcode=5))


def test_import_image_names_a_missing_archive_and_a_cluster_without_real_nodes(tmp_path: object) -> None:
    """`fluxnetes dev cluster import-image`: clear errors, no traceback."""
    from pathlib import Path

    from typer.testing import CliRunner

    from fluxnetes.cli.main import app

    d = Path(str(tmp_path))
    res = CliRunner().invoke(app, ["dev", "cluster", "import-image", str(d / "none.tar"), "--dir", str(d)])
    out = " ".join(res.output.split())  # the error is wrapped to the terminal's width
    assert res.exit_code != 0 and f"ARCHIVE: {d / 'none.tar'} is not a file" in out, out
    archive = d / "img.tar"
    archive.write_bytes(b"")
    res = CliRunner().invoke(app, ["dev", "cluster", "import-image", str(archive), "--dir", str(d / "c")])
    out = " ".join(res.output.split())
    assert res.exit_code != 0 and "Traceback" not in out and out.startswith("error:"), out
