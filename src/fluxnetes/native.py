"""Optional native build of the simulator's hot path: the engine's modules compiled with
mypyc (``hack/build-native.sh``), loaded by ``fluxnetes simulate`` and the benchmarks only.

Pure Python is the reference and always works. A build lives in a cache directory named by
a hash of the sources it was compiled from (``~/.cache/fluxnetes/native/<hash>/``, or
``$FLUXNETES_NATIVE_CACHE``); :func:`activate` loads it only when that hash equals the hash
of the sources this process would import, so an edited source is never shadowed by a stale
binary (it falls back to pure Python and says why). The hash covers every core package
(graph, jobspec, plan, match, queue), not only the compiled files: mypyc compiles in the
types of what a module imports, so a change to an imported class can invalidate a binary.

``FLUXNETES_NATIVE``: unset or ``auto`` = use the build when it matches; ``0`` = never;
``1`` = must (activate raises :class:`NativeError` with the reason instead of falling back).

The operator and the test suite do not call :func:`activate`: compiled code checks types at
its boundaries and its functions and classes cannot be monkeypatched, so the native build
stays where it was measured and tested (``bench/sim_native.py``, ``tests/test_native.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The modules compiled: the queue engine's hot path under ``fluxnetes simulate`` (from a
#: cProfile of a KTH-SP2 run; bench/results/sim_native.json). Others stay Python.
NATIVE_MODULES: tuple[str, ...] = (
    "fluxnetes.queue.cycle",
    "fluxnetes.queue.book",
    "fluxnetes.queue.walk",
    "fluxnetes.queue.profile",
    "fluxnetes.queue.protocol",
    "fluxnetes.queue.job",
    "fluxnetes.queue.hints",
    "fluxnetes.queue.policy",
    "fluxnetes.sim.engine",
    "fluxnetes.sim.machine",
    "fluxnetes.match.firstfit",
    "fluxnetes.match.counted",
    "fluxnetes.match.freenodes",
    "fluxnetes.match.matcher",
    # (split out of matcher.py: the counters' request shapes, a commit, a cancel and the
    # reservation search are theirs)
    "fluxnetes.match.countedpath",
    "fluxnetes.match.records",
    "fluxnetes.match.reservesearch",
    "fluxnetes.match.spans",
    "fluxnetes.match.multiset",
    "fluxnetes.match.results",
    "fluxnetes.plan.planner",
    "fluxnetes.plan.spantable",  # (split out of planner.py: the span table's window queries)
    "fluxnetes.jobspec.model",
)

#: Packages whose every source is hashed (plus the compiled modules outside them).
HASHED_PACKAGES: tuple[str, ...] = ("graph", "jobspec", "plan", "match", "queue")

MANIFEST = "manifest.json"
KEEP_BUILDS = 4  # builds kept in the cache (newest first): e.g. a few branches' sources
ENV_SWITCH = "FLUXNETES_NATIVE"
ENV_CACHE = "FLUXNETES_NATIVE_CACHE"


class NativeError(RuntimeError):
    """The native build could not be built, or was required (FLUXNETES_NATIVE=1) and could
    not be used (the message says why)."""


@dataclass(frozen=True)
class NativeStatus:
    """What :func:`activate` did: ``active`` (compiled modules loaded) and a one-line
    ``detail`` for the user (which build, or why pure Python)."""

    active: bool
    detail: str
    build: str = ""

    def describe(self) -> str:
        return f"native (mypyc build {self.build[:12]})" if self.active else (
            f"pure Python ({self.detail})")


def package_root() -> Path:
    """The ``fluxnetes`` package directory this process imports from."""
    return Path(__file__).resolve().parent


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(ENV_CACHE) or Path.home() / ".cache" / "fluxnetes" / "native")


def _module_file(root: Path, name: str) -> Path:
    return root.joinpath(*name.split(".")[1:]).with_suffix(".py")


def hashed_files(root: Path) -> list[Path]:
    """The sources a build depends on, sorted (relative to ``root``)."""
    files = {p for pkg in HASHED_PACKAGES for p in (root / pkg).rglob("*.py")}
    files |= {_module_file(root, name) for name in NATIVE_MODULES}
    return sorted(p.relative_to(root) for p in files)


def source_hash(root: Path | None = None) -> str:
    """Hash of the sources under ``root`` (default: this package), the module list, the
    Python ABI and the mypyc (mypy) version: the key of a build."""
    import mypy.version  # mypyc ships with mypy: same version

    root = root or package_root()
    h = hashlib.sha256()
    for part in (sys.implementation.cache_tag, importlib.machinery.EXTENSION_SUFFIXES[0],
                 mypy.version.__version__, ",".join(NATIVE_MODULES)):
        h.update(part.encode() + b"\0")
    for rel in hashed_files(root):
        h.update(str(rel).encode() + b"\0")
        h.update((root / rel).read_bytes() + b"\0")
    return h.hexdigest()[:24]


def read_manifest(build_dir: Path) -> dict[str, object] | None:
    try:
        data = json.loads((build_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class NativeFinder(importlib.abc.MetaPathFinder):
    """Serves extension-module specs for exactly the names of one build (the compiled
    modules and mypyc's shared library); every other import goes on as usual."""

    def __init__(self, files: Mapping[str, Path], build: str) -> None:
        self.files = dict(files)
        self.build = build

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _pure(detail: str, required: bool) -> NativeStatus:
    if required:
        raise NativeError(f"{ENV_SWITCH}=1 but the native build cannot be used: {detail}")
    return NativeStatus(False, detail)


def activate(env: Mapping[str, str] | None = None, root: Path | None = None) -> NativeStatus:
    """Load the native build for the sources under ``root`` (default: this package) if there
    is one whose hash matches, before anything imports the compiled modules; else pure
    Python, with the reason in the returned status."""
    env = os.environ if env is None else env
    switch = env.get(ENV_SWITCH, "auto").strip().lower()
    if switch not in ("", "auto", "0", "1"):
        raise NativeError(f"{ENV_SWITCH} must be 0, 1 or auto (got {switch!r})")
    if switch == "0":
        return NativeStatus(False, f"{ENV_SWITCH}=0")
    required = switch == "1"
    active = [f for f in sys.meta_path if isinstance(f, NativeFinder)]
    if active:
        return NativeStatus(True, f"mypyc build {active[0].build}", active[0].build)
    if not importlib.machinery.EXTENSION_SUFFIXES:
        return _pure("this Python loads no extension modules", required)
    try:
        key = source_hash(root)
    except (ImportError, OSError) as exc:
        return _pure(f"cannot hash the sources ({exc})", required)
    cache = cache_root(env)
    build_dir = cache / key
    manifest = read_manifest(build_dir)
    if manifest is None or manifest.get("hash") != key:
        others = [d.name for d in cache.iterdir() if read_manifest(d)] if cache.is_dir() else []
        why = (f"the native build(s) in {cache} are for other sources (stale: sources edited "
               f"since); hack/build-native.sh rebuilds" if others else
               "no native build for these sources; hack/build-native.sh builds one")
        return _pure(why, required)
    names = manifest.get("files")
    if not isinstance(names, dict) or not all(n in names for n in NATIVE_MODULES):
        return _pure(f"{build_dir / MANIFEST} does not list the compiled modules", required)
    files = {str(n): build_dir / str(f) for n, f in names.items()}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        return _pure(f"the native build is incomplete (missing {missing[0]})", required)
    loaded = [n for n in NATIVE_MODULES if n in sys.modules]
    if loaded:
        return _pure(f"{loaded[0]} was imported before the native build could be loaded",
                     required)
    before = set(sys.modules)
    finder = NativeFinder(files, key)
    sys.meta_path.insert(0, finder)
    try:
        for name in NATIVE_MODULES:  # now, so that a broken build falls back here, not later
            importlib.import_module(name)
    except Exception as exc:  # an unloadable binary (ABI, missing symbol): back to Python
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            del sys.modules[name]
        return _pure(f"the native build in {build_dir} failed to load ({exc})", required)
    return NativeStatus(True, f"mypyc build {key}", key)


def is_native(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a compiled extension."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def build(env: Mapping[str, str] | None = None, root: Path | None = None,
          log: bool = True) -> Path:
    """Compile :data:`NATIVE_MODULES` from the sources under ``root`` (default: this package)
    with mypyc into ``<cache>/<hash>/`` and return that directory; a build already there for
    the same hash is reused (seconds). Raises :class:`NativeError` when mypyc or the C
    compiler fails (its output is in the message)."""
    root = root or package_root()
    key = source_hash(root)
    cache = cache_root(env)
    target = cache / key
    if read_manifest(target) is not None:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=cache))
    try:
        # compile a copy: mypyc writes its extensions next to the sources, and a binary next
        # to a source would shadow it for every later import
        src = work / "src" / "fluxnetes"
        shutil.copytree(root, src, ignore=shutil.ignore_patterns(
            "__pycache__", "*.so", "*.pyd", "data"))
        if source_hash(src) != key:
            raise NativeError("the sources changed while being copied; run the build again")
        paths = [str(_module_file(src, n).relative_to(src.parent)) for n in NATIVE_MODULES]
        started, load = time.monotonic(), os.getloadavg()[0]
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cmd = [sys.executable, "-m", "mypyc", "--python-version",
               f"{sys.version_info.major}.{sys.version_info.minor}",
               "--ignore-missing-imports", *paths]
        proc = subprocess.run(cmd, cwd=src.parent, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise NativeError(f"mypyc failed (exit {proc.returncode}):\n{tail}")
        out = work / "out"
        files: dict[str, str] = {}
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        # mypyc's shared library lands beside the package, one shim per module inside it
        # (its build/ directory holds copies of both: not collected)
        for so in sorted([*src.parent.glob(f"*{suffix}"), *src.rglob(f"*{suffix}")]):
            rel = so.relative_to(src.parent)
            name = ".".join(rel.parts)[: -len(suffix)]
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(so), out / rel)
            files[name] = str(rel)
        if not all(n in files for n in NATIVE_MODULES):
            raise NativeError(f"mypyc built {sorted(files)}, not all of {NATIVE_MODULES}")
        import mypy.version

        manifest = {"hash": key, "files": files, "modules": list(NATIVE_MODULES),
                    "mypy": mypy.version.__version__, "python": sys.version.split()[0],
                    "build_seconds": round(seconds, 1), "build_cpu_seconds": round(cpu, 1),
                    "load_average_at_build": round(load, 1),
                    "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            out.rename(target)  # atomic: a reader sees no build or a whole one
        except OSError:
            if read_manifest(target) is None:  # not a concurrent build that won the race
                raise
        prune(cache, keep=KEEP_BUILDS)
        if log:
            print(f"native: built {len(NATIVE_MODULES)} modules in {seconds:.0f} s "
                  f"({cpu:.0f} s CPU) -> {target}", file=sys.stderr)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prune(cache: Path, keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest builds in ``cache`` (each source change makes a new
    one, a few MB); returns what was removed. A process still running from a removed build
    keeps its mapped files (Linux), a new one would rebuild."""
    builds = sorted((d for d in cache.iterdir() if d.is_dir() and read_manifest(d)),
                    key=lambda d: (d / MANIFEST).stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return builds[keep:]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fluxnetes.native build|status`` (hack/build-native.sh runs ``build``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["build"]:
        try:
            target = build()
        except NativeError as exc:
            print(f"native: {exc}", file=sys.stderr)
            return 1
        print(f"native: build {target.name} in {target.parent}")
        return 0
    if args == ["status"]:
        try:
            print(activate().describe())
        except NativeError as exc:
            print(f"native: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m fluxnetes.native build|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
