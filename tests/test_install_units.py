"""What a fresh machine needs to install fleetops as the README says, checked without building
anything: the version is written in pyproject.toml (a clone without tags builds the release
CHANGELOG names), the license is an SPDX expression with its file, the client lock ships inside the
package, and README's install block builds the wheel from the clone with the script it names and
puts only `fleet` on PATH. tests/test_readme_install_lab.py runs that block."""

from __future__ import annotations

import os
import re

from conftest import REPO
from packaging.requirements import Requirement
from packaging.version import Version

from fleetops.locks import client_lock

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
README = (REPO / "README.md").read_text()


def install_block() -> list[str]:
    """The command lines of README's first sh block under "## Install", comments and blank lines
    dropped."""
    section = README.split("\n## Install", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert block, "README's install section has no sh block"
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def newest_release() -> str:
    """The newest version CHANGELOG.md gives a heading of its own (`## [0.14.0] - date`), not
    [Unreleased]."""
    found = re.search(
        r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (REPO / "CHANGELOG.md").read_text(), re.M
    )
    assert found, "CHANGELOG.md has no release heading"
    return found.group(1)


def test_the_version_is_written_in_pyproject_and_is_changelogs_newest_release():
    project = PYPROJECT["project"]
    assert "version" not in project.get("dynamic", []), (
        "a version read from git tags is 0.0.1.devN in a clone"
    )
    assert project["version"] == newest_release()
    requires = [Requirement(r).name for r in PYPROJECT["build-system"]["requires"]]
    assert "setuptools-scm" not in requires and "setuptools_scm" not in PYPROJECT.get("tool", {})
    wheel = re.search(r"dist/fleetops-(\S+)-py3-none-any\.whl", README)
    assert wheel and wheel.group(1) == project["version"], (
        "README's install block names another version"
    )


def test_the_license_is_an_spdx_expression_with_its_file_and_setuptools_reads_both():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert (
        project["license-files"] == ["LICENSE"]
        and "Apache License" in (REPO / "LICENSE").read_text()[:200]
    )
    setuptools = next(
        Requirement(r)
        for r in PYPROJECT["build-system"]["requires"]
        if Requirement(r).name == "setuptools"
    )
    floor = min(Version(s.version) for s in setuptools.specifier if s.operator == ">=")
    assert floor >= Version("77"), (
        f"{setuptools}: SPDX license and license-files need setuptools 77"
    )
    assert any(s.operator == "<" for s in setuptools.specifier), f"{setuptools}: no upper bound"


def test_the_client_lock_is_package_data_and_the_checkouts_lock_is_that_file():
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["fleetops"]
    assert "requirements.lock" in data
    assert (REPO / "requirements.lock").is_symlink()
    assert (REPO / "requirements.lock").resolve() == REPO / "fleetops" / "requirements.lock"
    text = client_lock()
    assert text == (REPO / "requirements.lock").read_text()
    assert re.search(r"^fabric==\S+ \\\n    --hash=sha256:", text, re.M), text[:300]
    assert "-o fleetops/requirements.lock" in (REPO / "scripts" / "lock").read_text()


def test_readmes_install_block_builds_the_wheel_from_the_clone_and_installs_only_fleet():
    lines = install_block()
    # --include-deps puts inv, invoke, pygmentize, markdown-it ... on PATH beside fleet.
    assert not re.search(r"pipx install[^`\n]*--include-deps", README)
    assert "not\non the package index" in README or "not on the package index" in README
    build = REPO / lines[0]
    assert lines[0] == "scripts/build" and build.is_file() and os.access(build, os.X_OK), lines
    assert lines[1] == "pipx install dist/fleetops-*.whl", lines
    # the wheel the next line installs is where it said
    assert "ls dist/fleetops-*.whl" in build.read_text()
    assert not any(re.match(r"pipx install\s+fleetops\b", line) for line in lines)
    assert [line.split()[:2] for line in lines[2:4]] == [["fleet", "init"], ["cd", "ops"]], lines


def test_a_new_project_gets_the_lock_the_package_carries(tmp_path):
    from fleetops.init import make_project
    from fleetops.locks import client_lock

    make_project(tmp_path)
    written = (tmp_path / "requirements.lock").read_text()
    assert written == client_lock() == (REPO / "fleetops" / "requirements.lock").read_text()
    assert "--hash=sha256:" in written and "fabric==" in written
