"""`fluxnetes simulate --fairshare FILE` with FluxAccount manifests (the operator's own
resource, e.g. examples/accounts.yaml): read by the operator's reader, the same figures as
the equivalent tree file, trace users charging accounts through Namespaces named after
them, and bad manifests refused with the field and the rule."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.main import app
from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.fairshare import FairShareSimError, accounts_for
from fluxnetes.sim.runner import bundled_trace
from fluxnetes.sim.swf import SwfHeader, SwfRecord, SwfTrace

ROOT = Path(__file__).resolve().parents[1]
FLUXACCOUNT = "apiVersion: fluxnetes.io/v1alpha1\nkind: FluxAccount\n"


@pytest.fixture(scope="module")
def kth(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The header and the first 300 jobs of KTH-SP2."""
    path = tmp_path_factory.mktemp("trace") / "kth300.swf"
    lines, jobs = [], 0
    with gzip.open(bundled_trace(), "rt") as handle:
        for line in handle:
            lines.append(line)
            jobs += not line.startswith(";")
            if jobs == 300:
                break
    path.write_text("".join(lines))
    return str(path)


def simulate(trace: str, accounts: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["simulate", trace, "--fairshare", str(accounts), "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    data.pop("wall_seconds")  # a timing
    assert data["fairshare"].pop("accounts") == str(accounts)
    return data


def test_examples_accounts_yaml_gives_the_figures_of_its_tree_file(kth: str, tmp_path: Path) -> None:
    # examples/accounts.yaml as the core's tree: no namespace there is a trace user's, so
    # every job charges the default account, operations
    tree = tmp_path / "tree.yaml"
    tree.write_text("default: operations\naccounts:\n"
                    "  research: {shares: 70}\n"
                    "  research-ml: {parent: research, shares: 2, limits: {max_running_gpus: 8, max_queued_jobs: 500}}\n"
                    "  research-sim: {parent: research, shares: 1}\n"
                    "  operations: {shares: 30, limits: {max_running_cores: 64, max_running_jobs: 100}}\n")
    manifests = simulate(kth, ROOT / "examples/accounts.yaml")
    assert manifests == simulate(kth, tree)
    assert manifests["jobs"] == 300 and set(manifests["fairness"]["accounts"]) == {"operations"}


def test_namespaces_named_after_trace_users_choose_their_account(kth: str, tmp_path: Path) -> None:
    # the three busiest users of these jobs (18, 25, 11) in two teams, as a kind: List; the
    # same tree in the core's format gives the same figures
    items = [
        {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": name}, "spec": spec}
        for name, spec in [("physics", {"shares": 70}), ("chemistry", {"shares": 30}),
                           ("user-18", {"parent": "physics"}), ("user-25", {"parent": "physics", "shares": 2}),
                           ("user-11", {"parent": "chemistry"}), ("others", {"parent": "chemistry", "default": True})]
    ] + [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": user, "labels": {"fluxnetes.io/account": user}}}
        for user in ("user-18", "user-25", "user-11")
    ]
    manifests = tmp_path / "accounts.yaml"
    manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    tree = tmp_path / "tree.yaml"
    tree.write_text("default: others\naccounts:\n"
                    "  physics: {shares: 70, users: {user-18: 1, user-25: 2}}\n"
                    "  chemistry: {shares: 30, users: [user-11]}\n"
                    "  others: {parent: chemistry}\n")
    got = simulate(kth, manifests)
    assert got == simulate(kth, tree)
    assert set(got["fairness"]["accounts"]) == {"user-18", "user-25", "user-11", "others"}


def _trace(users: list[int]) -> tuple[SwfTrace, list[SimJob]]:
    recs = [SwfRecord(*([i + 1, i * 10, 0, 100, 1, -1, -1, 1, 100, -1, 1, u, u + 100]
                        + [-1] * 5 + [i + 1])) for i, u in enumerate(users)]
    return SwfTrace(SwfHeader(), recs, []), [SimJob(str(i + 1), i * 10, 100, 100, 1) for i in range(len(users))]


def test_jobs_charge_their_users_namespace_else_their_groups_else_the_default(tmp_path: Path) -> None:
    trace, jobs = _trace([1, 2, 3, 4])
    f = tmp_path / "accounts.yaml"
    f.write_text(FLUXACCOUNT + "metadata: {name: a}\n---\n" + FLUXACCOUNT + "metadata: {name: b}\n---\n"
                 "apiVersion: v1\nkind: Namespace\nmetadata: {name: user-1, labels: {fluxnetes.io/account: a}}\n"
                 "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: group-102, annotations: "
                 "{fluxnetes.io/account: b}}\n---\napiVersion: v1\nkind: Namespace\n"
                 "metadata: {name: user-3, labels: {fluxnetes.io/account: nope}}\n")
    acc = accounts_for(str(f), trace, jobs)
    # no FluxAccount is the default: the operator's implicit 'default' leaf (1 share)
    assert acc.account_of == {"1": "a", "2": "b", "3": "default", "4": "default"}
    assert acc.tree.leaves == ["a", "b", "default"]
    assert any("Namespace user-3" in n and "unknown FluxAccount 'nope'" in n for n in acc.notes)
    assert any("implicit account 'default'" in n for n in acc.notes)


@pytest.mark.parametrize(("content", "message"), [
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {shares: 0}\n", "FluxAccount a: spec.shares: must be >= 1, got 0"),
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {parent: b}\n", "FluxAccount a: spec.parent: unknown account 'b'"),
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {parent: b}\n---\n" + FLUXACCOUNT
     + "metadata: {name: b}\nspec: {parent: a}\n", "FluxAccount a: spec.parent: cycle: a -> b -> a"),
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {share: 2}\n", "FluxAccount a: spec.share: unknown field"),
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {limits: {maxRunningCores: -1}}\n",
     "FluxAccount a: spec.limits.maxRunningCores: must be >= 0, got -1"),
    (FLUXACCOUNT + "metadata: {name: a}\nspec: {default: true}\n---\n" + FLUXACCOUNT
     + "metadata: {name: b}\nspec: {default: true}\n", "FluxAccount b: spec.default: only one account"),
    (FLUXACCOUNT + "spec: {shares: 2}\n", "FluxAccount: metadata.name: must be a non-empty name"),
    (FLUXACCOUNT + "metadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
     "document 2: kind: only FluxAccount and Namespace manifests"),
    ("apiVersion: v1\nkind: FluxAccount\nmetadata: {name: a}\n",
     "document 1: apiVersion: a FluxAccount is fluxnetes.io/v1alpha1, got 'v1'"),
    ("apiVersion: v1\nkind: List\nitems: {a: 1}\n", "document 1: items: a List needs a list of manifests"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: user-1}\n", "no FluxAccount"),
    ("accounts: {a: {}}\n---\naccounts: {b: {}}\n", "2 YAML documents: a tree file is one document"),
    (FLUXACCOUNT + "metadata: {name: a}\n---\n" + FLUXACCOUNT + "metadata: [name\n", "not valid YAML (line"),
])
def test_bad_manifests_are_named_errors(kth: str, tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "accounts.yaml"
    f.write_text(content)
    result = CliRunner().invoke(app, ["simulate", kth, "--fairshare", str(f)])
    assert result.exit_code == 2, result.output
    assert message in result.output and str(f) in result.output
    assert "Traceback" not in result.output
    with pytest.raises(FairShareSimError, match="--fairshare"):
        accounts_for(str(f), *_trace([1]))


def test_reading_manifests_loads_no_kubernetes_client() -> None:
    # the simulator reuses the operator's reader because it is pure; if it ever pulls in
    # the API client (or anything else of the operator), it must move out of k8s/ instead
    import subprocess
    import sys

    import fluxnetes

    code = ("import sys; from pathlib import Path; from fluxnetes.sim.fairshare import load_account_file; "
            f"load_account_file(Path({str(ROOT / 'examples/accounts.yaml')!r})); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('fluxnetes.k8s'))))")
    src = str(Path(fluxnetes.__file__).parent.parent)
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": src}, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == ["fluxnetes.k8s", "fluxnetes.k8s.fairshare", "fluxnetes.k8s.fairshare.accounts",
                                   "fluxnetes.k8s.names"]
