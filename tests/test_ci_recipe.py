"""The CI recipe's workflow (docs/ci/kernel-project.yml, shown by docs/ci.md) passes a
linter: check-jsonschema against GitHub's workflow schema, which it ships (a misspelt key
fails it, as the negative control shows); every mtwork command in it parses with mtwork's
own command line; every MTWORK_ variable it sets is one the README's settings table
documents; its macOS job runs on Apple Silicon."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtwork import cli

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "ci" / "kernel-project.yml"
# GitHub's macOS runners on Apple Silicon (the Intel ones are macos-13 and *-intel).
APPLE_SILICON_RUNNERS = {"macos-14", "macos-15", "macos-26", "macos-latest"}


def lint(path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("check_jsonschema", reason="the dev extras bring check-jsonschema")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.github-workflows", str(path)], capture_output=True,
                          text=True, timeout=120)


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_the_workflow_passes_the_linter() -> None:
    done = lint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_linter_fails_a_misspelt_workflow(tmp_path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on: macos-15", "run-on: macos-15"))
    done = lint(broken)
    assert done.returncode != 0 and "run-on" in done.stdout + done.stderr


def _steps() -> list[dict]:
    return [step for job in workflow()["jobs"].values() for step in job["steps"]]


def test_every_pytest_option_is_the_plugins() -> None:
    options = {word for step in _steps() for word in step.get("run", "").split()
               if word.startswith("--mtwork")}
    assert options == {"--mtwork", "--mtwork-sanitize"}
    plugin = (ROOT / "mtwork" / "pytest_plugin.py").read_text()
    for option in options:
        assert f'"{option}"' in plugin, option


def test_every_mtwork_command_parses() -> None:
    commands = [shlex.split(line) for step in _steps() if "run" in step
                for line in step["run"].splitlines() if line.startswith("mtwork ")]
    assert {c[1] for c in commands} == {"selftest", "run"}
    for command in commands:
        cli.parser().parse_args(command[1:])  # argparse exits on what it does not know


def test_the_settings_it_uses_are_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    used = {name for step in _steps() for name in step.get("env", {})
            if name.startswith("MTWORK_")}
    assert used == {"MTWORK_BACKEND", "MTWORK_SANITIZE"}
    for name in used:
        assert re.search(rf"^\| `{name}` \|", readme, re.M), name


def test_the_jobs_run_where_they_say() -> None:
    jobs = workflow()["jobs"]
    assert jobs["macos"]["runs-on"] in APPLE_SILICON_RUNNERS
    assert jobs["linux"]["runs-on"].startswith("ubuntu-")
    runs = {name: " ".join(s.get("run", "") for s in job["steps"]) for name, job in
            jobs.items()}
    assert "mtwork selftest" in runs["macos"] and "--backend metal" in runs["macos"]
    assert "--mtwork-sanitize" in runs["linux"] and "--backend sim" in runs["linux"]


def test_the_page_shows_the_file_as_it_is() -> None:
    page = (ROOT / "docs" / "ci.md").read_text()
    assert f'--8<-- "ci/{WORKFLOW.name}"' in page
