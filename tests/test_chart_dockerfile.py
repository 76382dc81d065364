"""Lint of the operator image's Dockerfile. No container engine runs on the test machine, so
the image is not built here: these checks hold the essentials the chart relies on."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # join continuation lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def build_args() -> dict[str, str]:
    """Defaults of the global ARGs (those before the first FROM)."""
    out: dict[str, str] = {}
    for word, rest in instructions():
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            out[key] = value
    return out


def test_final_stage_is_slim_python() -> None:
    base = final_stage()[0][1]
    # FROM ${BASE_IMAGE}: hack/build-image.sh passes another Debian base; the default is slim
    name = re.fullmatch(r"\$\{?(\w+)\}?", base)
    if name:
        base = build_args()[name.group(1)]
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users, "no USER in the final stage: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]
    # numeric, so that the chart's runAsNonRoot can verify it, and the same uid as the chart
    chart = (ROOT / "deploy/chart/templates/deployment.yaml").read_text()
    assert f"runAsUser: {uid}" in chart


def test_entrypoint_is_fluxnetes_run() -> None:
    entry = [rest for word, rest in final_stage() if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["fluxnetes", "run"]
    # the chart passes only flags (args), never the subcommand again
    chart = (ROOT / "deploy/chart/templates/deployment.yaml").read_text()
    assert "- run\n" not in chart


def test_no_remote_add_and_no_secrets() -> None:
    for word, rest in instructions():
        if word == "ADD":
            assert not re.search(r"https?://|git@", rest), f"ADD of a remote source: {rest}"
        assert not re.search(r"(?i)(password|token|secret)=", rest), f"{word} {rest}"


def test_read_only_root_filesystem_friendly() -> None:
    env = " ".join(rest for word, rest in final_stage() if word == "ENV")
    # no .pyc written next to the code, and HOME (caches, matplotlib config) on the /tmp volume
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env
    workdirs = [rest for word, rest in final_stage() if word == "WORKDIR"]
    assert workdirs[-1] == "/tmp"


def test_final_stage_gets_the_built_package_only() -> None:
    """Built in the first stage (wheels only, no compiler), copied as a finished venv: the
    final stage installs nothing and has no pip; `fluxnetes` is on PATH (the chart's init
    container runs `fluxnetes store ensure-secret`)."""
    final = final_stage()
    run = " ".join(rest for word, rest in final if word == "RUN")
    assert "pip install" not in run
    copies = [rest for word, rest in final if word == "COPY"]
    assert any(c.startswith("--from=") for c in copies), copies
    build = " ".join(rest for word, rest in instructions()[: len(instructions()) - len(final)] if word == "RUN")
    assert "--only-binary=:all:" in build and "uninstall" in build and "pip" in build
    env = " ".join(rest for word, rest in final if word == "ENV")
    venv = next(c.split()[-1] for c in copies if c.startswith("--from="))
    assert f"PATH={venv}/bin:" in env, env
    assert "fluxnetes --help" in run  # the entry point is checked at build time
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("**") + 1 :], ".dockerignore must re-include the sources"
    assert "**" in ignore  # everything else (venv, caches, tests, .git) stays out of the context
