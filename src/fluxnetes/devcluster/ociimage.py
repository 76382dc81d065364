"""Small single-layer OCI image archives for the real nodes (pause, a busybox test image),
made from files of this machine without a container engine or a registry.

The archive is an OCI image layout in a tar (oci-layout, index.json, blobs/sha256/...), the
form `ctr images import` reads; its index names the image both ways containerd looks for
(io.containerd.image.name and org.opencontainers.image.ref.name).

    python -m fluxnetes.devcluster.ociimage OUT.tar NAME --file /pause=/path/to/pause \
        --entrypoint /pause
    python -m fluxnetes.devcluster.ociimage OUT.tar NAME --layer-tar rootfs.tar --cmd /bin/bash
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: small images, fast import
# fixed timestamps: the same inputs give the same archive (and the same image id)
EPOCH = 0


@dataclass(frozen=True)
class ImageSpec:
    name: str  # e.g. localhost/fluxnetes-pause:1
    files: dict[str, Path] = field(default_factory=dict)  # path in the image -> file here
    symlinks: dict[str, str] = field(default_factory=dict)  # path in the image -> target
    dirs: tuple[str, ...] = ()  # empty directories (e.g. /tmp), mode 1777 for /tmp
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",)
    # a whole root file system already packed as a tar (e.g. by debootstrap and `tar`), taken as
    # the image's one layer instead of files/symlinks/dirs (owners and modes as in the tar)
    layer_tar: Path | None = None


def _layer(spec: ImageSpec) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parents: set[str] = set()

        def add_parents(path: str) -> None:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in parents:
                    parents.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
                    tar.addfile(info)

        for path in spec.dirs:
            add_parents(path)
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.mtime = tarfile.DIRTYPE, EPOCH
            info.mode = 0o1777 if path.strip("/") == "tmp" else 0o755
            if info.name not in parents:
                parents.add(info.name)
                tar.addfile(info)
        for path, src in sorted(spec.files.items()):
            add_parents(path)
            data = src.read_bytes()
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mtime = len(data), EPOCH
            info.mode = 0o755 if src.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(spec.symlinks.items()):
            add_parents(path)
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, EPOCH
            tar.addfile(info)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_archive(spec: ImageSpec, out: Path) -> str:
    """Write the image as an OCI layout tar at `out`; returns the manifest digest."""
    if spec.layer_tar is not None and (spec.files or spec.symlinks or spec.dirs):
        raise ValueError("layer_tar is the whole layer: give it alone, without files, symlinks or dirs")
    layer_digest, layer = _blob(spec.layer_tar.read_bytes() if spec.layer_tar else _layer(spec))
    config_doc: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": list(spec.env)},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    if spec.entrypoint:
        config_doc["config"]["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config_doc["config"]["Cmd"] = list(spec.cmd)
    config_digest, config = _blob(_json(config_doc))
    manifest_digest, manifest = _blob(_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}],
    }))
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = _json({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": spec.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = [
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("index.json", index),
            *((f"blobs/sha256/{d.split(':', 1)[1]}", b) for d, b in
              ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest))),
        ]
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return manifest_digest


def _pair(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise SystemExit(f"{flag} takes IMAGE_PATH=VALUE (got {text!r})")
    a, b = text.split("=", 1)
    return a, b


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a one-layer OCI image archive")
    ap.add_argument("out", type=Path)
    ap.add_argument("name")
    ap.add_argument("--file", action="append", default=[], help="/path/in/image=/host/file")
    ap.add_argument("--symlink", action="append", default=[], help="/path/in/image=target")
    ap.add_argument("--dir", action="append", default=[], help="an empty directory")
    ap.add_argument("--layer-tar", type=Path, help="a root file system tar: the whole layer")
    ap.add_argument("--entrypoint", nargs="*", default=[])
    ap.add_argument("--cmd", nargs="*", default=[])
    args = ap.parse_args(argv)
    files = {a: Path(b) for a, b in (_pair(f, "--file") for f in args.file)}
    for p, src in files.items():
        if not src.is_file():
            raise SystemExit(f"--file {p}: {src} is not a file")
    if args.layer_tar is not None and not args.layer_tar.is_file():
        raise SystemExit(f"--layer-tar: {args.layer_tar} is not a file")
    if args.layer_tar is not None and (files or args.symlink or args.dir):
        raise SystemExit("--layer-tar is the whole layer: give it without --file, --symlink or --dir")
    spec = ImageSpec(
        name=args.name,
        files=files,
        symlinks=dict(_pair(s, "--symlink") for s in args.symlink),
        dirs=tuple(args.dir),
        entrypoint=tuple(args.entrypoint),
        cmd=tuple(args.cmd),
        layer_tar=args.layer_tar,
    )
    print(write_archive(spec, args.out))


if __name__ == "__main__":
    main()
