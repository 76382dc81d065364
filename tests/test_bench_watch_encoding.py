"""The framing bench/watch_encoding.py reads watch streams with: a protobuf watch stream's
length-prefixed frames (4-byte big-endian length, then the frame), split across the chunks a
socket delivers, and the JSON stream's lines. No protobuf classes needed."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "watch_encoding.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("watch_encoding_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


we = _bench()


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_frames_split_across_chunks_come_out_whole_and_in_order() -> None:
    payloads = [b"", b"a", b"\x00" * 3, b"k8s\x00" + bytes(range(256)) * 300]  # 76,804 bytes: length > 65,535
    stream = b"".join(frame(p) for p in payloads)
    for size in (1, 3, 4, 5, 7, 1000, len(stream)):
        got, buf = [], b""
        for i in range(0, len(stream), size):
            frames, buf = we.split_frames(buf + stream[i:i + size])
            got += frames
        assert got == payloads, size
        assert buf == b""


def test_an_incomplete_frame_is_kept_for_the_next_chunk() -> None:
    stream = frame(b"first") + frame(b"second")
    frames, rest = we.split_frames(stream[:-2])
    assert frames == [b"first"]
    assert rest == stream[len(frame(b"first")):-2]
    frames, rest = we.split_frames(stream[:2])  # not even the length yet
    assert (frames, rest) == ([], stream[:2])


def test_a_stream_with_bytes_after_its_last_whole_frame_is_an_error() -> None:
    assert we.all_frames(frame(b"x") + frame(b"yz")) == [b"x", b"yz"]
    with pytest.raises(we.FrameError, match="3 bytes after the last whole frame"):
        we.all_frames(frame(b"x") + b"\x00\x00\x00")


def test_json_lines_skip_blank_lines_and_keep_the_partial_last_one() -> None:
    lines, rest = we.split_lines(b'{"a":1}\n\n{"b":2}\n{"c"')
    assert lines == [b'{"a":1}', b'{"b":2}']
    assert rest == b'{"c"'


def test_unset_proto_scalars_compare_equal_to_absent_json_keys() -> None:
    assert we.normal(("", 0, False, None, [{"k": ""}])) == we.normal((None, None, None, None, [{"k": None}]))
    assert we.normal(("n", 1)) != we.normal((None, 1))
