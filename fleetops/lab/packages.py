"""A lab node's venv and packages: the venv made over the base venv (a .pth names the base's
site-packages) or from another Python, the node's own packages (OWN_PACKAGES) reset to the base
venv's pristine copies with their wheels in the node's pip cache, anything else in its site-packages
removed, another version installed or another base venv used."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import OWN_PACKAGES, base_dir, site_packages
from .files import mirror, remove
from .node import Node
from .wheels import PIP_CACHE, give_wheels

# in a node's site-packages: the base venv's site-packages it runs on
BASE_PTH = "_fleetops_lab_base.pth"


def make_venv(node: Node, base: Path, wheels: Path) -> None:
    """The node's venv: over the base venv (its packages after the node's own on sys.path, through a
    .pth), or, for a node of another Python, from that interpreter with only the node's own
    packages. Those are the base venv's files as pip installed them from PyPI (speculators is pure
    Python), copied: a few MB and no index; speculators 0.3.0 declares Requires-Python >= 3.10,
    which a 3.9 node does not enforce: what runs there is the agent, which reads, patches and
    compiles the files."""
    python = node.interpreter or str(base / "bin" / "python")
    subprocess.run([python, "-m", "venv", "--without-pip", str(node.venv)], check=True)
    if not node.interpreter:
        (site_packages(node.venv) / BASE_PTH).write_text(str(site_packages(base)) + "\n")
    reset_packages(node, base, wheels)


def reset_packages(node: Node, base: Path, wheels: Path) -> None:
    """Give the node pristine copies of its own packages (as installed from PyPI), by putting back
    only what differs from the base venv's copy: a file whose bytes, mode or owner changed is copied
    again, one the base lacks (bytecode, a backup, another version's files) is removed, an unchanged
    one is left alone. `wheels`: the lab's folder of wheels built from base venvs."""
    src, dst = site_packages(base), site_packages(node.venv)
    for package in OWN_PACKAGES:
        wanted = [src / package, *src.glob(f"{package}-*.dist-info")]
        for old in [dst / package, *dst.glob(f"{package}-*.dist-info")]:
            if old.name not in {w.name for w in wanted}:
                remove(old)
        for entry in wanted:
            mirror(entry, dst / entry.name)
    # The wheels a node installed from an index would have in its pip cache: capture proves pristine
    # bytes from them, with no index (wheels.py).
    give_wheels(src, OWN_PACKAGES, wheels / base.name, node.dir / PIP_CACHE)


def own_entries(base_site: Path) -> set[str]:
    """The names a node's site-packages may hold: the .pth and the base venv's own packages with
    their dist-info."""
    return {BASE_PTH} | {
        e.name for p in OWN_PACKAGES for e in [base_site / p, *base_site.glob(f"{p}-*.dist-info")]
    }


def prune_site(node: Node, base_site: Path, own: set[str]) -> None:
    """The node's site-packages holding only `own` (own_entries), its .pth naming `base_site` (none
    for a node of another Python: the base venv's packages are not for it)."""
    site = site_packages(node.venv)
    for entry in site.iterdir():
        if entry.name not in own:  # another version installed beside them, a lock, bytecode
            remove(entry)
    if node.interpreter:
        remove(site / BASE_PTH)
    elif not (site / BASE_PTH).is_file() or (site / BASE_PTH).read_text() != f"{base_site}\n":
        remove(site / BASE_PTH)
        (site / BASE_PTH).write_text(f"{base_site}\n")


def install_package(node: Node, requirement: str) -> None:
    """One real package version (e.g. vllm==0.11.0) installed into the node without its
    dependencies, shadowing the shared one."""
    base = base_dir()
    site = site_packages(node.venv)
    name = requirement.split("==")[0].strip().replace("-", "_")
    for old in [site / name, *site.glob(f"{name}-*.dist-info")]:
        # pip --target leaves an older dist-info behind, and metadata would read it
        if old.exists():
            shutil.rmtree(old)
    # A node of another Python gets the wheels for its own version (pip --python-version, wheels
    # only)
    other = (
        ["--python-version", node.python_version, "--only-binary=:all:"] if node.interpreter else []
    )
    subprocess.run(
        [
            str(base / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--upgrade",
            *other,
            "--target",
            str(site_packages(node.venv)),
            requirement,
        ],
        check=True,
    )


def node_base(node: Node) -> Path:
    """The base venv whose packages the node runs on (its .pth file names that base's
    site-packages)."""
    try:
        site = Path((site_packages(node.venv) / BASE_PTH).read_text().strip())
    except OSError:
        return base_dir()
    return site.parents[2]  # <base>/lib/pythonX.Y/site-packages


def use_base(node: Node, base: Path, wheels: Path) -> None:
    """The node on another base venv: its .pth names that base's site-packages, and its own packages
    become that base's pristine copies."""
    site = site_packages(node.venv)
    # what lab.install --package left beside its own packages shadows the base
    for entry in site.iterdir():
        if entry.name != BASE_PTH and not any(
            entry.name == p or entry.name.startswith(f"{p}-") for p in OWN_PACKAGES
        ):
            remove(entry)
    tmp = site / f".{BASE_PTH}.tmp"
    tmp.write_text(f"{site_packages(base)}\n")
    os.replace(tmp, site / BASE_PTH)
    reset_packages(node, base, wheels)
