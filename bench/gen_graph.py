"""Generate core-level JGF graphs exactly as Fluxion's generators write them.

Shape: cluster0 -> rackR (``nodes_per_rack`` nodes each) -> nodeN -> socketS -> coreC
[-> gpuG, memoryM]. Conventions copied from the reference graphs in
``../shared/data/fluxion-conformance`` beside the repository (tiny.json, medium.json), which this generator
reproduces byte for byte:

* vertices in pre-order; JGF ``id`` = ``uniq_id`` = pre-order index (as a string for ``id``);
* ``id`` (the logical id, also the name suffix) is global for racks and nodes, node-local for
  sockets, cores, GPUs and memory pools (core ids run on across the sockets of one node);
* within a socket: cores, then GPUs, then the memory pool (``size`` = GB, ``unit`` "GB");
* every vertex carries ``exclusive: false``, ``unit``, ``size`` and ``paths.containment``;
  ``rank`` is -1 above nodes and the node index at and below a node;
* one edge per parent -> child in the order of the children, subsystem "containment";
* the document is ``{"graph": {"nodes": [...], "edges": [...]}}`` in ``json.dumps`` style on a
  single line without a trailing newline.

Files are streamed (no whole document in memory) into a cache directory outside the
repository (default: the user cache dir, e.g. ~/.cache/fluxnetes/bench); large JGFs are never
committed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import typer


@dataclass(frozen=True)
class Shape:
    nodes: int
    nodes_per_rack: int = 32
    sockets: int = 2
    cores_per_socket: int = 32
    gpus_per_socket: int = 0
    memory_gb_per_socket: int = 0  # 0 = no memory pool

    @property
    def racks(self) -> int:
        return -(-self.nodes // self.nodes_per_rack)

    def filename(self) -> str:
        extra = ""
        if self.gpus_per_socket:
            extra += f"-g{self.gpus_per_socket}"
        if self.memory_gb_per_socket:
            extra += f"-m{self.memory_gb_per_socket}"
        return (
            f"jgf-n{self.nodes}-r{self.nodes_per_rack}-s{self.sockets}"
            f"-c{self.cores_per_socket}{extra}.json"
        )

    def vertex_count(self) -> int:
        per_socket = 1 + self.cores_per_socket + self.gpus_per_socket
        per_socket += 1 if self.memory_gb_per_socket else 0
        return 1 + self.racks + self.nodes * (1 + self.sockets * per_socket)


def default_cache_dir() -> Path:
    env = os.environ.get("FLUXNETES_BENCH_CACHE")
    if env:
        return Path(env)
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("fluxnetes")) / "bench"
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return Path.home() / ".cache" / "fluxnetes" / "bench"


def _vertex(
    uid: int, vtype: str, lid: int, rank: int, path: str, size: int = 1, unit: str = ""
) -> str:
    return (
        f'{{"id": "{uid}", "metadata": {{"type": "{vtype}", "basename": "{vtype}", '
        f'"name": "{vtype}{lid}", "id": {lid}, "uniq_id": {uid}, "rank": {rank}, '
        f'"exclusive": false, "unit": "{unit}", "size": {size}, '
        f'"paths": {{"containment": "{path}"}}}}}}'
    )


def _edge(src: int, dst: int) -> str:
    return f'{{"source": "{src}", "target": "{dst}", "metadata": {{"subsystem": "containment"}}}}'


def iter_graph(shape: Shape) -> Iterator[tuple[str, tuple[int, int] | None]]:
    """Yield (vertex JSON, (parent uid, uid) or None for the root) in pre-order."""
    uid = 0
    root = uid
    yield _vertex(uid, "cluster", 0, -1, "/cluster0"), None
    node = 0
    for r in range(shape.racks):
        uid += 1
        rack = uid
        rpath = f"/cluster0/rack{r}"
        yield _vertex(rack, "rack", r, -1, rpath), (root, rack)
        for _ in range(min(shape.nodes_per_rack, shape.nodes - node)):
            uid += 1
            nuid = uid
            npath = f"{rpath}/node{node}"
            yield _vertex(nuid, "node", node, node, npath), (rack, nuid)
            core = gpu = 0
            for s in range(shape.sockets):
                uid += 1
                suid = uid
                spath = f"{npath}/socket{s}"
                yield _vertex(suid, "socket", s, node, spath), (nuid, suid)
                for _ in range(shape.cores_per_socket):
                    uid += 1
                    yield _vertex(uid, "core", core, node, f"{spath}/core{core}"), (suid, uid)
                    core += 1
                for _ in range(shape.gpus_per_socket):
                    uid += 1
                    yield _vertex(uid, "gpu", gpu, node, f"{spath}/gpu{gpu}"), (suid, uid)
                    gpu += 1
                if shape.memory_gb_per_socket:
                    uid += 1
                    yield (
                        _vertex(
                            uid,
                            "memory",
                            s,
                            node,
                            f"{spath}/memory{s}",
                            size=shape.memory_gb_per_socket,
                            unit="GB",
                        ),
                        (suid, uid),
                    )
            node += 1


def write_jgf(shape: Shape, out: TextIO) -> int:
    """Stream the JGF of ``shape`` to ``out``; returns the number of vertices."""
    edges: list[tuple[int, int]] = []
    out.write('{"graph": {"nodes": [')
    n = 0
    for text, edge in iter_graph(shape):
        if n:
            out.write(", ")
        out.write(text)
        n += 1
        if edge is not None:
            edges.append(edge)
    out.write('], "edges": [')
    out.write(", ".join(_edge(a, b) for a, b in edges))
    out.write("]}}")
    return n


def ensure_graph(shape: Shape, cache_dir: Path | None = None) -> Path:
    """Path of the cached JGF for ``shape``, generating it if missing."""
    directory = cache_dir or default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / shape.filename()
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            write_jgf(shape, fh)
        tmp.replace(path)
    return path


GPU_VARIANT = {"gpus_per_socket": 2, "memory_gb_per_socket": 256}

# the reference graphs this generator must reproduce byte for byte
# (the shared data lives beside the repository: <repo>/../shared/data)
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "fluxion-conformance"
REFERENCE_SHAPES = {
    "tiny.json": Shape(
        4,
        nodes_per_rack=4,
        sockets=2,
        cores_per_socket=4,
        gpus_per_socket=1,
        memory_gb_per_socket=16,
    ),
    "medium.json": Shape(
        16,
        nodes_per_rack=8,
        sockets=2,
        cores_per_socket=8,
        gpus_per_socket=2,
        memory_gb_per_socket=64,
    ),
}


def check_reference(directory: Path = REFERENCE_DIR) -> list[str]:
    """Compare the generator's output with the reference graphs; returns problems found."""
    import io

    problems = []
    for name, shape in REFERENCE_SHAPES.items():
        ref = directory / name
        if not ref.exists():
            problems.append(f"{ref}: missing")
            continue
        buf = io.StringIO()
        write_jgf(shape, buf)
        if buf.getvalue() != ref.read_text(encoding="utf-8"):
            problems.append(f"{ref}: generated JGF differs")
    return problems


app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])


@app.command()
def main(
    nodes: list[int] = typer.Option([16, 128, 1024, 4096], "--nodes", "-n", help="node counts"),
    nodes_per_rack: int = typer.Option(32, help="nodes per rack"),
    sockets: int = typer.Option(2, help="sockets per node"),
    cores_per_socket: int = typer.Option(32, help="cores per socket"),
    gpu_variant: bool = typer.Option(False, help="add 2 GPUs and a 256 GB memory pool per socket"),
    cache_dir: Path | None = typer.Option(None, help="output directory (default: user cache)"),
    force: bool = typer.Option(False, help="regenerate even if cached"),
    check: bool = typer.Option(
        False, "--check-reference", help="only verify byte equality with the reference JGFs"
    ),
) -> None:
    """Write the JGF files (one per node count) and print their paths."""
    if check:
        problems = check_reference()
        for p in problems:
            typer.echo(p, err=True)
        if problems:
            raise typer.Exit(1)
        typer.echo(f"identical to {', '.join(REFERENCE_SHAPES)} in {REFERENCE_DIR}")
        return
    for n in nodes:
        if n < 1:
            raise typer.BadParameter(f"node count must be >= 1, got {n}", param_hint="--nodes")
        shape = Shape(
            nodes=n,
            nodes_per_rack=nodes_per_rack,
            sockets=sockets,
            cores_per_socket=cores_per_socket,
            **(GPU_VARIANT if gpu_variant else {}),
        )
        target = (cache_dir or default_cache_dir()) / shape.filename()
        if force and target.exists():
            target.unlink()
        path = ensure_graph(shape, cache_dir)
        typer.echo(f"{path}  ({shape.vertex_count()} vertices, {path.stat().st_size} bytes)")


if __name__ == "__main__":
    app()
