"""What pyproject.toml and the lock files promise, checked without building anything: every package
is in the wheel's list, every dependency has an upper bound and the locks pin inside it (with
hashes, the client lock the dev lock's pins), and the client Pythons are stated the same way in
pyproject and the README."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CLIENT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)(?: ; (.+?))? \\$", re.M)


def locked(name: str) -> dict[tuple[str, str], str]:
    """(package, marker) -> version, from a lock file; every pin followed by at least one sha256."""
    pins = {}
    for entry in re.split(r"\n(?=[^\s#])", (REPO / name).read_text()):
        m = PIN.match(entry)
        if m:
            assert "\n    --hash=sha256:" in entry, f"{name}: no hash for {m.group(0)}"
            pins[(m.group(1).lower(), m.group(3) or "")] = m.group(2)
    return pins


LAB_PYPROJECT = tomllib.loads((REPO / "fleetops-lab" / "pyproject.toml").read_text())


def package_names(top: Path, name: str) -> set[str]:
    """Every package (a folder with __init__.py) under `top`, named as `name` and its subpackages;
    under fleetops/, the agent's link is left to the agent's own folder."""
    return {
        ".".join([name, *p.parent.relative_to(top).parts])
        for p in top.rglob("__init__.py")
        if top.name != "fleetops" or p.relative_to(top).parts[0] != "agent"
    }


def test_every_package_folder_is_in_one_wheel_under_one_top_level_package():
    # The node agent's folder, remote_scripts/, is fleetops.agent in the wheel: fleetops/agent links
    # to it. The lab's folder is the fleetops-lab wheel's, whose project folder links to it.
    for link, target in (
        (REPO / "fleetops" / "agent", REPO / "remote_scripts"),
        (REPO / "fleetops-lab" / "fleetops" / "lab", REPO / "fleetops" / "lab"),
    ):
        assert link.is_symlink() and link.resolve() == target.resolve(), link
    found = package_names(REPO / "fleetops", "fleetops") | package_names(
        REPO / "remote_scripts", "fleetops.agent"
    )
    main, lab = (
        PYPROJECT["tool"]["setuptools"]["packages"],
        LAB_PYPROJECT["tool"]["setuptools"]["packages"],
    )
    assert sorted(main + lab) == sorted(found) and not set(main) & set(lab)
    assert {name.split(".")[0] for name in main + lab} == {"fleetops"}
    assert sorted(lab) == sorted(n for n in found if n.split(".")[:2] == ["fleetops", "lab"])


def test_the_lab_wheel_is_fleetops_version_and_the_lab_extra_names_it():
    version = PYPROJECT["project"]["version"]
    assert LAB_PYPROJECT["project"]["version"] == version
    assert LAB_PYPROJECT["project"]["dependencies"] == [f"fleetops=={version}"]
    assert PYPROJECT["project"]["optional-dependencies"]["lab"] == [f"fleetops-lab=={version}"]
    assert LAB_PYPROJECT["build-system"] == PYPROJECT["build-system"]
    assert LAB_PYPROJECT["project"]["requires-python"] == PYPROJECT["project"]["requires-python"]


def test_every_dependency_has_an_upper_bound():
    for line in [
        *PYPROJECT["project"]["dependencies"],
        *PYPROJECT["project"]["optional-dependencies"]["dev"],
    ]:
        req = Requirement(line)
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), (
            f"{line}: no upper bound"
        )


def test_the_locks_pin_inside_pyprojects_bounds_and_agree():
    client, dev = locked("requirements.lock"), locked("requirements-dev.lock")
    assert client and dev
    for key, version in client.items():
        # A pin the test tools need on every Python (no marker) covers the client's pin for some
        # Pythons.
        pinned = dev.get(key, dev.get((key[0], "")))
        assert pinned == version, (
            f"{key}: requirements.lock {version}, requirements-dev.lock {pinned}"
        )
    by_name = {name: version for (name, _), version in dev.items()}
    for line in [
        *PYPROJECT["project"]["dependencies"],
        *PYPROJECT["project"]["optional-dependencies"]["dev"],
    ]:
        req = Requirement(line)
        name = req.name.lower()
        versions = [v for (n, _), v in dev.items() if n == name]
        assert versions, f"{name} is not locked"
        for version in versions:
            assert req.specifier.contains(version, prereleases=True), (
                f"{name} {version} outside {req.specifier}"
            )
        if line in PYPROJECT["project"]["dependencies"]:
            assert {v for (n, _), v in client.items() if n == name} == {by_name[name]}, name
    # One version of each client dependency on every Python, so the client matrix tests one set; but
    # pycparser (cffi's C parser, used when cffi builds), whose 3.12 left Python 3.10.
    split = {n for n, _ in client if len({v for (m, _), v in client.items() if m == n}) > 1}
    assert split == {"pycparser"}, split


def test_the_client_pythons_are_stated_alike():
    project = PYPROJECT["project"]
    spec = SpecifierSet(project["requires-python"])
    assert [v for v in ("3.9", *CLIENT_PYTHONS, "3.14") if spec.contains(f"{v}.0")] == list(
        CLIENT_PYTHONS
    )
    classified = [
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert classified == list(CLIENT_PYTHONS)
    readme = (REPO / "README.md").read_text()
    assert "client: Python 3.10, 3.11, 3.12 and 3.13" in readme


def test_the_setup_installs_the_lock_with_hashes():
    setup = (REPO / "scripts" / "setup").read_text()
    assert "--require-hashes -r requirements-dev.lock" in setup and "--no-deps -e ." in setup
    assert Path(REPO / "scripts" / "lock").is_file()


def test_every_client_python_is_tested():
    # The suite runs on .venv's Python (scripts/setup's python3); a matrix file runs it on each of
    # the others.
    cfg = (REPO / ".venv" / "pyvenv.cfg").read_text()
    own = re.search(
        r"^version(?:_info)? "
        r"= (\d+\.\d+)",
        cfg,
        re.M,
    ).group(1)  # type: ignore[union-attr]
    matrix = {
        f"3.{m.group(1)}"
        for p in (REPO / "tests").glob("test_client_matrix_py3*.py")
        if (m := re.fullmatch(r"test_client_matrix_py3(\d+)\.py", p.name))
    }
    assert own not in matrix and matrix | {own} == set(CLIENT_PYTHONS), (own, sorted(matrix))
