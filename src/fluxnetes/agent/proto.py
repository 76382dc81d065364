"""The agents' wire format: length-prefixed frames over a TLS stream.

A frame is ``!II`` (header length, payload length), a JSON header (orjson) and raw payload
bytes (file chunks travel as payload, never inside JSON). Every header has a ``t`` (type).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

_PREFIX = struct.Struct("!II")
MAX_HEADER = 16 * 1024 * 1024
MAX_PAYLOAD = 64 * 1024 * 1024

Header = dict[str, Any]


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def encode(header: Header, payload: bytes = b"") -> bytes:
    head = orjson.dumps(header)
    return _PREFIX.pack(len(head), len(payload)) + head + payload


async def send(writer: asyncio.StreamWriter, header: Header, payload: bytes = b"") -> None:
    head = orjson.dumps(header)
    writer.write(_PREFIX.pack(len(head), len(payload)) + head)
    if payload:
        writer.write(payload)
    await writer.drain()


async def recv(reader: asyncio.StreamReader) -> tuple[Header, bytes]:
    """One frame; raises asyncio.IncompleteReadError at EOF."""
    hlen, plen = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise ProtocolError(f"frame too large (header {hlen} B, payload {plen} B)")
    try:
        header = orjson.loads(await reader.readexactly(hlen))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"bad frame header: {exc}") from None
    if not isinstance(header, dict) or "t" not in header:
        raise ProtocolError("frame header without a type")
    payload = await reader.readexactly(plen) if plen else b""
    return header, payload
