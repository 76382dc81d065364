"""Helpers shared by several test modules (imported as `helpers`; tests/ is on sys.path because
it holds conftest.py). No tests here."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]


def cli_app(command_module: ModuleType) -> typer.Typer:
    """An app holding only the command group(s) of one `fluxnetes.cli.<name>_cmd` module.

    The no-op callback makes it a group, so commands are invoked by name as in `fluxnetes`."""
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    command_module.register(app)
    return app


def fluxjob_namespace(request: pytest.FixtureRequest, prefix: str) -> tuple[Any, str]:
    """The session's `k8s_cluster` with the FluxJob CRD established, and a fresh namespace
    `<prefix>-xxxxxx` in it (the caller deletes it)."""
    try:
        cluster = request.getfixturevalue("k8s_cluster")
    except pytest.FixtureLookupError:
        pytest.skip("no k8s_cluster fixture (tests/conftest.py) in this checkout")
    crd = (ROOT / "deploy/crds/fluxjobs.fluxnetes.io.yaml").read_text()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crd)
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/fluxjobs.fluxnetes.io"
    )
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    return cluster, ns


def patch_fluxjob_status(cluster: Any, ns: str, name: str, status: dict[str, Any]) -> None:
    """Set fields of a FluxJob's status (merge patch; the CRD has no status subresource)."""
    cluster.kubectl(
        "patch",
        "fluxjob",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
