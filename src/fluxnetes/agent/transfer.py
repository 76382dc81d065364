"""Chunked, checksum-verified content for ``nodes broadcast``.

The sender describes the file with a manifest (size, chunk size, sha256 of every chunk and of
the whole file). Every agent on the way keeps a :class:`Receiver`: chunks are written at their
offset in a staging file under the agent's state directory as they arrive (in any order: a
child that re-parents asks its new parent only for the chunks it is missing), each checked
against its sha256; once all are in, the whole-file sha256 is checked (computed on the fly
while chunks arrive in order) and, on a target node, the file is moved to its destination.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

CHUNK_SIZE = 1024 * 1024
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class TransferError(Exception):
    """A bad manifest, destination or chunk; the message says which and why."""


@dataclass(frozen=True)
class Manifest:
    id: str
    dest: str  # relative to the receiving agent's data directory
    size: int
    chunk_size: int
    sha256: str
    chunks: tuple[str, ...]
    targets: tuple[str, ...] | None = None  # None: every node
    mode: int = 0o644

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "dest": self.dest, "size": self.size, "chunkSize": self.chunk_size,
                "sha256": self.sha256, "chunks": list(self.chunks), "mode": self.mode,
                "targets": None if self.targets is None else list(self.targets)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        try:
            m = cls(str(d["id"]), str(d["dest"]), int(d["size"]), int(d["chunkSize"]), str(d["sha256"]),
                    tuple(str(c) for c in d["chunks"]),
                    None if d.get("targets") is None else tuple(str(t) for t in d["targets"]),
                    int(d.get("mode", 0o644)))
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferError(f"bad manifest: {exc!r}") from None
        m.check()
        return m

    def check(self) -> None:
        if not _ID.match(self.id):
            raise TransferError(f"manifest id {self.id!r}: letters, digits, _ and - only")
        if self.chunk_size < 1 or self.size < 0:
            raise TransferError("manifest: chunkSize must be >= 1 and size >= 0")
        if self.n_chunks != max(1, -(-self.size // self.chunk_size)):
            raise TransferError(f"manifest: {self.n_chunks} chunk checksums for {self.size} bytes "
                                f"in chunks of {self.chunk_size}")
        safe_dest(self.dest)

    def chunk_len(self, index: int) -> int:
        if index == self.n_chunks - 1:
            return self.size - index * self.chunk_size
        return self.chunk_size


def safe_dest(dest: str) -> PurePosixPath:
    """DEST as a path below the data directory: relative, no ``..``; a leading / is allowed
    (it means the data directory's root), so ``/datasets/x`` and ``datasets/x`` are the same."""
    p = PurePosixPath(dest.lstrip("/"))
    if not dest or not p.parts or dest.endswith("/") or any(part in ("..", ".") for part in p.parts):
        raise TransferError(f"DEST {dest!r}: give a file path below the agent's data directory "
                            "(no '..', not a directory)")
    return p


def iter_chunks(path: Path, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    with path.open("rb") as f:
        while True:
            data = f.read(chunk_size)
            if not data:
                return
            yield data


def make_manifest(path: Path, dest: str, transfer_id: str, *, chunk_size: int = CHUNK_SIZE,
                  targets: list[str] | None = None) -> Manifest:
    try:
        size = path.stat().st_size
        whole = hashlib.sha256()
        chunks = []
        for data in iter_chunks(path, chunk_size):
            whole.update(data)
            chunks.append(hashlib.sha256(data).hexdigest())
    except OSError as exc:
        raise TransferError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not chunks:
        chunks = [hashlib.sha256(b"").hexdigest()]
    mode = path.stat().st_mode & 0o777
    m = Manifest(transfer_id, dest, size, chunk_size, whole.hexdigest(), tuple(chunks),
                 None if targets is None else tuple(targets), mode)
    m.check()
    return m


@dataclass
class Receiver:
    manifest: Manifest
    staging: Path
    dest: Path | None  # None: this node relays only
    have: set[int] = field(default_factory=set)
    done: bool = False
    error: str = ""
    _fd: int = -1
    _next: int = 0
    _hash: Any = None
    _delivered: bool = False

    @classmethod
    def open(cls, manifest: Manifest, state_dir: Path, data_dir: Path | None) -> Receiver:
        state_dir.mkdir(parents=True, exist_ok=True)
        staging = state_dir / f"{manifest.id}.part"
        dest = data_dir / safe_dest(manifest.dest) if data_dir is not None else None
        r = cls(manifest, staging, dest)
        r._fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(r._fd, manifest.size)
        r._hash = hashlib.sha256()
        if manifest.size == 0:
            r.add(0, b"")
        return r

    def missing(self) -> list[int]:
        return [i for i in range(self.manifest.n_chunks) if i not in self.have]

    @property
    def complete(self) -> bool:
        return len(self.have) == self.manifest.n_chunks

    def add(self, index: int, data: bytes) -> bool:
        """Store chunk ``index``; False when it was there already. Raises on a bad checksum."""
        m = self.manifest
        if not 0 <= index < m.n_chunks:
            raise TransferError(f"transfer {m.id}: chunk {index} out of range 0..{m.n_chunks - 1}")
        if index in self.have or self.done:
            return False
        if len(data) != m.chunk_len(index) or hashlib.sha256(data).hexdigest() != m.chunks[index]:
            raise TransferError(f"transfer {m.id}: chunk {index} failed its sha256 check")
        os.pwrite(self._fd, data, index * m.chunk_size)
        self.have.add(index)
        # the whole-file digest advances over the in-order prefix (one pass, no re-read in the
        # common case; chunks that came early are read back once their turn comes)
        if index == self._next:
            self._hash.update(data)
            self._next += 1
        while self._next in self.have and self._next < m.n_chunks:
            self._hash.update(self.read(self._next))
            self._next += 1
        return True

    def read(self, index: int) -> bytes:
        m = self.manifest
        return os.pread(self._fd, m.chunk_len(index), index * m.chunk_size)

    def finish(self) -> str:
        """Check the whole file and deliver it; returns an error message or ''."""
        if self.done:
            return self.error
        self.done = True
        if self._hash.hexdigest() != self.manifest.sha256:
            self.error = f"whole-file sha256 mismatch ({self._hash.hexdigest()} != {self.manifest.sha256})"
            return self.error
        if self.dest is not None:
            try:
                self.dest.parent.mkdir(parents=True, exist_ok=True)
                os.fchmod(self._fd, self.manifest.mode)
                try:
                    # same filesystem: the staging file becomes the destination (no second
                    # write; the open descriptor still serves chunks to re-parenting children)
                    os.replace(self.staging, self.dest)
                    self.staging = self.dest
                    self._delivered = True
                except OSError:
                    tmp = self.dest.with_name(f".{self.dest.name}.{self.manifest.id}")
                    with tmp.open("wb") as out:
                        for i in range(self.manifest.n_chunks):
                            out.write(self.read(i))
                    tmp.chmod(self.manifest.mode)
                    os.replace(tmp, self.dest)
            except OSError as exc:
                self.error = f"cannot write {self.dest}: {exc.strerror or exc}"
        return self.error

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if not self._delivered:
            self.staging.unlink(missing_ok=True)
