"""The repository names no machine's absolute paths: code, docs and scripts refer to files
relative to the repository (issue #29 item 10), so they work on any clone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json"}
# an absolute path into the directory this checkout sits in (its siblings: the shared data,
# other checkouts) or into /work, where the project's machines keep them; paths inside
# containers (/home/mpiuser, /root/.ssh in the examples) are fine
ABSOLUTE = re.compile(
    r"(?<![\w.~$])(?:/work|" + re.escape(str(REPO.parent)) + r")/[\w.-]+"
)
# recorded benchmark results keep the paths of the run they record
RECORDS = ("bench/results/",)


def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [
        f
        for f in out.splitlines()
        if Path(f).suffix in TEXT and not f.startswith(RECORDS)
    ]


def test_no_tracked_file_names_an_absolute_machine_path() -> None:
    found = []
    for name in tracked_text_files():
        path = REPO / name
        if not path.is_file():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ABSOLUTE.search(line):
                found.append(f"{name}:{no}: {line.strip()}")
    assert found == []


def test_contributing_guide_is_at_the_root() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text()
    for part in ("## Set-up", "## Layout", "## Tests", "## Benchmarks", "## Style"):
        assert part in text
    assert not (REPO / "docs" / "CONTRIBUTING-helpers.md").exists()


def test_graph_generator_finds_the_reference_graphs_relative_to_the_repository() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gen_graph
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert REPO.parent / "shared" / "data" / "fluxion-conformance" == gen_graph.REFERENCE_DIR
    if not gen_graph.REFERENCE_DIR.exists():
        pytest.skip(f"reference graphs not found at {gen_graph.REFERENCE_DIR}")
    assert gen_graph.check_reference() == []


def test_docs_name_the_defaults_that_ship() -> None:
    """docs/comparison.md and the operator's README state what the code does (issue #29 item
    10): fair share and preemption ship, the webhook's policies, the default placement."""
    from fluxnetes.k8s.admission.webhook_config import Scope
    from fluxnetes.k8s.config import OperatorConfig

    comparison = (REPO / "docs" / "comparison.md").read_text()
    row = next(r for r in comparison.splitlines() if r.startswith("| Quotas / fair share"))
    assert "not yet" not in row and "preemption.md" in row and "fairshare.md" in row
    hook = next(r for r in comparison.splitlines() if r.startswith("| Webhook scope"))
    assert f"`failurePolicy: {Scope.failure_policy}` by default" in hook
    assert f"{Scope.timeout_seconds} s timeout" in hook and "`Ignore`" in hook
    for cited in re.findall(r"`(\w+\.json)`", comparison):
        assert (REPO / "bench" / "results" / cited).exists(), cited
    default = OperatorConfig.placement
    readme = (REPO / "src" / "fluxnetes" / "k8s" / "README.md").read_text()
    assert f"(the default, `--placement {default}`" in readme
    assert re.search(r"`--placement (?!" + default + r")\w+` \(the default\)", readme) is None
