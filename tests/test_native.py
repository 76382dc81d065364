"""The optional mypyc build of the simulator's hot path (``fluxnetes.native``).

* a build is used only for the exact sources it was compiled from: a build for other (stale)
  sources, an incomplete one or an unloadable one falls back to pure Python with the reason,
  and ``FLUXNETES_NATIVE=1`` turns that fallback into an error;
* the native build gives the same schedule as pure Python (every start time and placement)
  on a KTH-SP2 prefix under fcfs, easy and conservative.

The second needs the build (hack/build-native.sh, cached by source hash): skipped without
it unless FLUXNETES_REQUIRE_NATIVE=1 (hack/test.sh builds it and sets that). The test suite
itself runs on pure Python (conftest sets FLUXNETES_NATIVE=0); the runs here are fresh
processes that ask for a build explicitly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fluxnetes import native

PY = sys.executable


def _fake_build(cache: Path, key: str) -> Path:
    """A build directory for ``key`` whose "extensions" are not loadable (text files)."""
    d = cache / key
    files = {}
    for name in native.NATIVE_MODULES:
        rel = Path(*name.split(".")).with_suffix(".cpython-311-x86_64-linux-gnu.so")
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text("not an extension\n")
        files[name] = str(rel)
    (d / native.MANIFEST).write_text(json.dumps({"hash": key, "files": files}))
    return d


def _copy_package(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "fluxnetes"
    shutil.copytree(native.package_root(), src,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "data"))
    return src


def test_every_compiled_module_is_a_source_of_the_package() -> None:
    """The module list names files that exist (a module split or renamed must be renamed
    here too, or the build would fail, or the moved code would stay pure Python)."""
    root = native.package_root()
    missing = [name for name in native.NATIVE_MODULES
               if not (root / Path(*name.split(".")[1:])).with_suffix(".py").is_file()]
    assert not missing
    assert len(set(native.NATIVE_MODULES)) == len(native.NATIVE_MODULES)


def test_hash_follows_the_sources_not_their_place(tmp_path: Path) -> None:
    copy = _copy_package(tmp_path)
    assert native.source_hash(copy) == native.source_hash()
    # any core source counts, not only the compiled ones (mypyc compiles in imported types)
    graph_model = copy / "graph" / "model.py"
    graph_model.write_text(graph_model.read_text() + "\n# edited\n")
    assert native.source_hash(copy) != native.source_hash()


def test_a_build_for_other_sources_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    copy = _copy_package(tmp_path)
    _fake_build(cache, native.source_hash(copy))  # built for these sources ...
    cycle = copy / "queue" / "cycle.py"
    cycle.write_text(cycle.read_text() + "\n# edited after the build\n")  # ... then edited
    env = {native.ENV_CACHE: str(cache)}
    status = native.activate(env, root=copy)
    assert not status.active
    assert "stale" in status.detail and "hack/build-native.sh" in status.detail
    assert status.describe().startswith("pure Python (")
    with pytest.raises(native.NativeError, match=r"FLUXNETES_NATIVE=1 .*stale"):
        native.activate({**env, native.ENV_SWITCH: "1"}, root=copy)
    assert not any(isinstance(f, native.NativeFinder) for f in sys.meta_path)


def test_no_build_and_switches(tmp_path: Path) -> None:
    env = {native.ENV_CACHE: str(tmp_path / "empty")}
    status = native.activate(env)
    assert not status.active and "no native build for these sources" in status.detail
    assert native.activate({**env, native.ENV_SWITCH: "0"}).detail == "FLUXNETES_NATIVE=0"
    with pytest.raises(native.NativeError, match="FLUXNETES_NATIVE must be 0, 1 or auto"):
        native.activate({**env, native.ENV_SWITCH: "yes"})


def test_prune_keeps_the_newest_builds(tmp_path: Path) -> None:
    for i, key in enumerate(("a" * 24, "b" * 24, "c" * 24)):
        manifest = _fake_build(tmp_path, key) / native.MANIFEST
        os.utime(manifest, (1000 + i, 1000 + i))
    (tmp_path / ".build-x").mkdir()  # a build in progress: not a build, left alone
    removed = native.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["a" * 24]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".build-x", "b" * 24, "c" * 24]


def test_an_unloadable_build_falls_back_to_python(tmp_path: Path) -> None:
    """A fresh process (this one has imported the engine already): the finder is removed
    and the half-imported modules are dropped, the run goes on in pure Python."""
    cache = tmp_path / "cache"
    _fake_build(cache, native.source_hash())
    code = ("from fluxnetes import native; s = native.activate(); print(s.describe()); "
            "import fluxnetes.queue.cycle as c, sys; print(c.__file__); "
            "print(any(isinstance(f, native.NativeFinder) for f in sys.meta_path))")
    env = {**os.environ, native.ENV_CACHE: str(cache), native.ENV_SWITCH: "auto",
           "PYTHONPATH": str(native.package_root().parent)}
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].startswith("pure Python (the native build in ") and "failed to load" in out[0]
    assert out[1].endswith("cycle.py") and out[2] == "False"


# ---------------------------------------------------------------- the real build

RUN = """
import hashlib, json, sys
from fluxnetes import native
status = native.activate()
from fluxnetes.sim.machine import machine_from_header
from fluxnetes.sim.runner import bundled_trace, policy_for, prepare, run_policy
from fluxnetes.sim.swf import read_swf
import fluxnetes.queue.cycle as cycle
trace = read_swf(bundled_trace())
workload = prepare(trace, machine_from_header(trace.header), limit=int(sys.argv[1]))
out = {"native": status.active, "cycle_native": native.is_native(cycle)}
for policy in ("fcfs", "easy", "conservative"):
    run, summary = run_policy(workload, policy_for(policy))
    out[policy] = [[o.job.id, o.start, list(map(list, o.shares))] for o in run.outcomes]
print(json.dumps(out))
"""


def _run(switch: str, src: Path, limit: int = 3000) -> dict[str, object]:
    env = {**os.environ, native.ENV_SWITCH: switch, "PYTHONPATH": str(src)}
    proc = subprocess.run([PY, "-c", RUN, str(limit)], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


@pytest.fixture(scope="module")
def native_build() -> Path:
    build = native.cache_root() / native.source_hash()
    if native.read_manifest(build) is None:
        if os.environ.get("FLUXNETES_REQUIRE_NATIVE") == "1":
            pytest.fail(f"no native build for these sources in {build.parent} "
                        "(hack/build-native.sh builds it)")
        pytest.skip("no native build for these sources (hack/build-native.sh)")
    return build


def test_native_gives_the_same_schedules_as_python(native_build: Path) -> None:
    src = native.package_root().parent
    pure, fast = _run("0", src), _run("1", src)
    assert (pure["native"], pure["cycle_native"]) == (False, False)
    assert (fast["native"], fast["cycle_native"]) == (True, True)
    for policy in ("fcfs", "easy", "conservative"):
        assert fast[policy] == pure[policy], policy
        assert len(pure[policy]) > 2500  # type: ignore[arg-type]


def test_native_build_is_refused_for_edited_sources(native_build: Path, tmp_path: Path) -> None:
    copy = _copy_package(tmp_path)
    shutil.copytree(native.package_root() / "data", copy / "data")
    assert _run("1", copy.parent, limit=200)["native"] is True  # same sources elsewhere: used
    walk = copy / "queue" / "walk.py"
    walk.write_text(walk.read_text() + "\n# edited\n")
    env = {**os.environ, native.ENV_SWITCH: "auto", "PYTHONPATH": str(copy.parent)}
    proc = subprocess.run(
        [PY, "-c", "from fluxnetes import native; print(native.activate().describe())"],
        env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("pure Python (the native build(s) in ")
    assert "stale" in proc.stdout


RESULTS = """
import json
from fluxnetes import native
assert native.activate().active
from fluxnetes.match import Matcher
from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.machine import machine_from_size
machine = machine_from_size(4, 2)
matcher = Matcher(machine.graph, policy="first", counters=True)
result = matcher.allocate(machine.jobspec(SimJob("a", 0, 10, 10, 3)), now=0)
rv1 = result.to_rv1(with_scheduling=False)
print(json.dumps({"nodes": [n.name for n in result.nodes], "vertices": len(result.vertices),
                  "rv1": sorted(rv1), "info": matcher.info(result.jobid)["nodes"]}))
"""


def _run_native(script: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter with the native build switched on; its JSON."""
    env = {**os.environ, native.ENV_SWITCH: "1",
           "PYTHONPATH": str(native.package_root().parent)}
    proc = subprocess.run([PY, "-c", script], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout))


def test_native_counted_results_and_info(native_build: Path) -> None:
    """What the engine's own run does not touch, compiled: a counted result's vertices,
    nodes and R (the store recorder writes R) and ``Matcher.info`` (per-node records)."""
    out = _run_native(RESULTS)
    assert len(out["nodes"]) == 2 and out["vertices"] > 0
    assert "execution" in out["rv1"]
    assert [n["name"] for n in out["info"]] == out["nodes"]
    assert sum(n["cores"] for n in out["info"]) == 3


SUBCLASSES = """
import json
from fluxnetes import native
assert native.activate().active
import fluxnetes.queue.cycle as cycle
import fluxnetes.sim.engine as engine
from fluxnetes.match import Matcher
from fluxnetes.queue import QueuePolicy
from fluxnetes.sim.machine import machine_from_header, machine_from_size
from fluxnetes.sim.runner import bundled_trace, policy_for, prepare, run_policy
from fluxnetes.sim.swf import read_swf
trace = read_swf(bundled_trace())
workload = prepare(trace, machine_from_header(trace.header), limit=300)
count, _ = run_policy(workload, policy_for("easy"), engine="count")
queue, _ = run_policy(workload, policy_for("easy"))

class Seen(cycle.Scheduler):
    def cycle(self, pending, now, *, ordered=False, waiting=False):
        self.seen = getattr(self, "seen", 0) + 1
        return super().cycle(pending, now, ordered=ordered, waiting=waiting)

machine = machine_from_size(4, 1)
seen = Seen(Matcher(machine.graph, policy="first"),
            QueuePolicy.parse("easy", reservation_style="counted"), capacity_cores=4)
run = engine.simulate([engine.SimJob("1", 0, 10, 10, 3), engine.SimJob("2", 1, 5, 5, 4)],
                      seen, machine.jobspec, total_cores=4, min_cores_for=machine.min_cores)
print(json.dumps({"compiled": [native.is_native(cycle), native.is_native(engine)],
                  "same": [(o.job.id, o.start) for o in count.outcomes]
                          == [(o.job.id, o.start) for o in queue.outcomes],
                  "starts": [o.start for o in run.outcomes], "cycles": seen.seen}))
"""


def test_native_classes_python_subclasses(native_build: Path) -> None:
    """Under the native build, the count oracle (``sim/fastsim.py``, interpreted: its job
    record subclasses the compiled ``JobOutcome``) runs, and a Python subclass of the
    compiled ``Scheduler`` (how tests/test_sim.py observes its calls) drives a run: both
    raised TypeError / AttributeError before ``mypyc_attr(allow_interpreted_subclasses)``."""
    out = _run_native(SUBCLASSES)
    assert out["compiled"] == [True, True]
    assert out["same"] is True
    assert out["starts"] == [0, 10] and out["cycles"] >= 2
