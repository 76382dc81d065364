"""The operator image as built by hack/build-image.sh (out/image/fluxnetes-oci.tar).

The OCI archive is unpacked with umoci and its root filesystem is run the way a cluster with
`readOnlyRootFilesystem: true` runs it: in a private mount namespace the tree is bind-mounted
read-only, only /tmp is writable (a directory of the test, like the chart's emptyDir), /dev
holds the usual character devices, and the process runs with `chroot --userspec` as the image's
user, with the image's environment, working directory and entrypoint.

Skipped with the reason when the archive is missing (or umoci, or root), unless
FLUXNETES_REQUIRE_IMAGE=1 (hack/test.sh sets it once the image is built): then they fail.
FLUXNETES_IMAGE_ARCHIVE names another archive to check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from test_store_helpers import fresh_pg_database, pg_url

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = Path(os.environ.get("FLUXNETES_IMAGE_ARCHIVE") or ROOT / "out" / "image" / "fluxnetes-oci.tar")
UID = GID = 10001

# Runs in a new mount namespace (unshare --mount: private propagation, so nothing leaks to the
# host): $1 the unpacked root filesystem, $2 the host directory to use as /tmp, $3 uid:gid,
# $4 the working directory, then `NAME=VALUE`... and the command (its first word has no `=`).
# `exec` all the way down, so the process the test holds is the image's own process and
# receives its signals.
SANDBOX = r"""
set -eu
root=$1 tmp=$2 user=$3 cwd=$4; shift 4
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount --bind "$tmp" "$root/tmp"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,noexec,mode=755,size=64k tmpfs "$root/dev"
for d in null zero full random urandom; do
  : > "$root/dev/$d"
  mount --bind "/dev/$d" "$root/dev/$d"
done
mount -o remount,ro,nosuid,noexec,mode=755,size=64k "$root/dev"
exec chroot --userspec="$user" "$root" /usr/bin/env -i -C "$cwd" "$@"
"""


@dataclass
class Image:
    config: dict[str, Any]  # the OCI image configuration
    rootfs: Path

    @property
    def runtime(self) -> dict[str, Any]:
        return dict(self.config.get("config") or {})

    def popen(self, argv: list[str], tmp: Path, out: IO[bytes] | int = subprocess.PIPE,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Run argv in the image as its user, on its read-only root with `tmp` as /tmp."""
        rt = self.runtime
        image_env = [*rt.get("Env", []), *(f"{k}={v}" for k, v in (env or {}).items())]
        return subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", SANDBOX, "sandbox", str(self.rootfs), str(tmp),
             rt["User"], rt.get("WorkingDir") or "/", *image_env, *argv],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

    def run(self, argv: list[str], tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = self.popen(argv, tmp)
        out, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out.decode(errors="replace"), "")


def image_missing_reason() -> str | None:
    if not ARCHIVE.is_file():
        return f"the operator image {ARCHIVE} is not built (bash hack/build-image.sh)"
    for tool in ("umoci", "unshare", "chroot", "mount", "tar"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (bash hack/build-image.sh installs umoci)"
    if os.geteuid() != 0:
        return "running the image's root filesystem (mount namespace, chroot) needs root"
    return None


def blob(layout: Path, digest: str) -> dict[str, Any]:
    algo, _, hexdigest = digest.partition(":")
    return dict(json.loads((layout / "blobs" / algo / hexdigest).read_text()))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    """The archive unpacked once per module (about half a gigabyte, removed afterwards)."""
    reason = image_missing_reason()
    if reason and os.environ.get("FLUXNETES_REQUIRE_IMAGE") == "1":
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("image")
    layout = work / "layout"
    layout.mkdir()
    subprocess.run(["tar", "-xf", str(ARCHIVE), "-C", str(layout)], check=True)
    index = json.loads((layout / "index.json").read_text())
    assert len(index["manifests"]) == 1, index
    ref = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    manifest = blob(layout, index["manifests"][0]["digest"])
    config = blob(layout, manifest["config"]["digest"])
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{ref}", str(work / "bundle")],
                   check=True, capture_output=True)
    try:
        yield Image(config=config, rootfs=work / "bundle" / "rootfs")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def tmpdir_for_image(tmp_path: Path) -> Path:
    """The image's /tmp: an empty directory anyone may write (like an emptyDir)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    return tmp


# -- the image configuration ----------------------------------------------------------------


def test_config_runs_fluxnetes_as_non_root(image: Image) -> None:
    rt = image.runtime
    assert rt["User"] == f"{UID}:{GID}"  # numeric: the chart's runAsNonRoot can verify it
    assert rt["Entrypoint"] == ["fluxnetes", "run"]
    # a CMD inherited from the base (python3) would become an argument of `fluxnetes run`
    assert not rt.get("Cmd"), rt.get("Cmd")
    assert set(rt["ExposedPorts"]) == {"9443/tcp", "8080/tcp"}  # webhook, metrics
    assert rt["WorkingDir"] == "/tmp"


def test_config_keeps_python_off_the_root_filesystem(image: Image) -> None:
    env = dict(e.partition("=")[::2] for e in image.runtime["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == env["TMPDIR"] == "/tmp"
    assert env["MPLCONFIGDIR"].startswith("/tmp/")
    assert env["PATH"].split(":")[0] == "/opt/fluxnetes/bin"
    # the build's proxy CA is an argument of the build stage only
    assert "PIP_CERT" not in json.dumps(image.config)


# -- the root filesystem ----------------------------------------------------------------------


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            yield path, path.lstat()


def test_no_setuid_or_setgid_files_and_nothing_owned_by_the_user(image: Image) -> None:
    special, owned = [], []
    for path, st in walk(image.rootfs):
        rel = "/" + str(path.relative_to(image.rootfs))
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            special.append(rel)
        if st.st_uid == UID or st.st_gid == GID:
            owned.append(rel)
    assert special == [], f"setuid/setgid files: {special}"
    assert owned == [], f"files the runtime user owns: {owned[:20]}"


def test_slim_no_compiler_no_pip_no_caches(image: Image) -> None:
    fs = image.rootfs
    bins = [p.name for d in ("usr/bin", "usr/local/bin") if (fs / d).is_dir() for p in (fs / d).iterdir()]
    compilers = [b for b in bins if b in {"cc", "gcc", "g++", "c++", "clang", "make", "ld"} or "-gcc" in b]
    assert compilers == []
    venv = fs / "opt" / "fluxnetes"
    site = list(venv.glob("lib/python3.*/site-packages"))
    assert len(site) == 1
    assert (site[0] / "fluxnetes").is_dir()
    assert not (site[0] / "pip").exists() and not (venv / "bin" / "pip").exists()
    assert not list(fs.glob("root/.cache/pip")) and not list(fs.glob("tmp/*"))
    assert not list(fs.glob("mnt/*")) and not list(fs.glob("src")), "build leftovers"
    assert not list(fs.glob("var/lib/apt/lists/*_Packages")) and not list(fs.glob("var/cache/apt/archives/*.deb"))


# -- running it -------------------------------------------------------------------------------


def test_sandbox_is_read_only_and_runs_as_the_image_user(image: Image, tmpdir_for_image: Path) -> None:
    """The test's own premise: the root filesystem refuses writes, /tmp takes them."""
    probe = (
        "import errno, os\n"
        "print(os.getuid(), os.getgid(), sorted(os.getgroups()), os.getcwd())\n"
        "for path in ('/opt/fluxnetes/x', '/etc/x', '/x'):\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "    except OSError as exc:\n"
        "        assert exc.errno == errno.EROFS, exc  # not merely EACCES: the mount refuses\n"
        "    else:\n"
        "        raise SystemExit(f'{path} is writable')\n"
        "open('/tmp/probe', 'w').write('ok')\n"
    )
    res = image.run(["python3", "-c", probe], tmpdir_for_image)
    assert res.returncode == 0, res.stdout
    assert res.stdout.split("\n")[0] == f"{UID} {GID} [{GID}] /tmp"
    assert (tmpdir_for_image / "probe").read_text() == "ok"


@pytest.mark.parametrize("argv", [["fluxnetes", "--help"], ["ENTRYPOINT", "--help"]], ids=["cli", "entrypoint"])
def test_help_runs_on_a_read_only_root(image: Image, tmpdir_for_image: Path, argv: list[str]) -> None:
    if argv[0] == "ENTRYPOINT":
        argv = [*image.runtime["Entrypoint"], *argv[1:]]
    res = image.run(argv, tmpdir_for_image)
    assert res.returncode == 0, res.stdout
    assert "Usage:" in res.stdout and "Traceback" not in res.stdout
    if argv[:2] == ["fluxnetes", "run"]:
        assert "--kubeconfig" in res.stdout and "--webhook-port" in res.stdout
    else:
        assert " run " in res.stdout and " ctl " in res.stdout
    assert list(tmpdir_for_image.iterdir()) == []  # --help writes nothing, not even to /tmp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(
    params=[
        pytest.param("default", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(pg_url() is None, reason="FLUXNETES_TEST_PG_URL is not set"),
        ]),
    ]
)
def operator_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The operator's --store: the default SQLite file (under HOME=/tmp), or a fresh database
    on the test PostgreSQL server (the chart's setup; psycopg's bundled libpq in the image)."""
    if request.param == "default":
        yield "default"
    else:
        yield from fresh_pg_database()


def test_operator_from_the_image_gets_ready_against_the_control_plane(
    image: Image, k8s_cluster: Any, operator_store: str, tmpdir_for_image: Path, tmp_path: Path
) -> None:
    """`fluxnetes run` (the entrypoint) from the image, as uid 10001 on a read-only root: it
    opens its store, syncs with the real kube-apiserver, serves its webhook and /readyz, and
    stops cleanly on SIGTERM."""
    kubeconfig = tmpdir_for_image / "kubeconfig"
    shutil.copyfile(k8s_cluster.kubeconfig, kubeconfig)
    os.chown(kubeconfig, UID, GID)
    kubeconfig.chmod(0o600)
    metrics = free_port()
    op_ns = f"fluxnetes-image-{uuid.uuid4().hex[:6]}"  # its own Lease, never a terminating namespace
    log_path = tmp_path / "operator.log"
    argv = [*image.runtime["Entrypoint"], "--kubeconfig", "/tmp/kubeconfig", "--webhook-port", "0",
            "--namespace", op_ns, "--store", operator_store, "--log-format", "text",
            "--metrics-port", str(metrics)]
    with log_path.open("wb") as log:
        proc = image.popen(argv, tmpdir_for_image, out=log)
    try:
        deadline = time.monotonic() + 120
        while "operator ready" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, f"the operator exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no 'operator ready':\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        # /readyz follows "operator ready" within a moment
        while readyz(metrics) != 200:
            assert time.monotonic() < deadline, f"/readyz never 200:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                k8s_cluster.kubectl("delete", kind, "fluxnetes.io", "--ignore-not-found", check=False)
            for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
                k8s_cluster.kubectl("delete", kind, "fluxnetes.io-gate", "--ignore-not-found", check=False)
            # (fluxnetes-probe stays: a terminating one would hold the next operator's probe back)
            k8s_cluster.kubectl("delete", "namespace", op_ns, "--ignore-not-found", "--wait=false", check=False)
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "Read-only file system" not in text, text[-3000:]
    if operator_store == "default":
        # everything it wrote is under /tmp, the default store too
        assert list(tmpdir_for_image.glob(".local/share/fluxnetes/fluxnetes.db")), sorted(
            str(p.relative_to(tmpdir_for_image)) for p in tmpdir_for_image.rglob("*"))
    else:
        from sqlalchemy import create_engine, inspect

        engine = create_engine(operator_store)
        try:
            assert "alembic_version" in inspect(engine).get_table_names()  # the schema it made
        finally:
            engine.dispose()
