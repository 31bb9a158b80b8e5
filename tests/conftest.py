"""Shared fixtures. Lab tests run against real OpenSSH sshd processes on 127.0.0.1 that these fixtures start,
and real speculators 0.3.0 / vllm 0.16.0 in the node venvs (nothing is mocked)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from base64 import urlsafe_b64decode
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Tests append to their own audit log, never to the operator's (~/.local/state/fleetops/audit.jsonl).
os.environ.setdefault("FLEETOPS_AUDIT_LOG", str(Path(tempfile.mkdtemp(prefix="fleetops-audit-")) / "audit.jsonl"))
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"


def make_project(root: Path) -> Path:
    """A throwaway copy of the project layout (fabfile, config, playbooks) with its own hosts/ and .lab/."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks"):
        (root / name).symlink_to(REPO / name)
    (root / "hosts").mkdir()
    (root / "tests").symlink_to(REPO / "tests")
    return root


def run_fab(project: Path, *args: str, env: dict | None = None, timeout: float = 900,
            check: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=project, capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"fab {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def fab_json(project: Path, *args: str, **kw) -> tuple[int, dict]:
    proc = run_fab(project, *args, "--json", **kw)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from fab {args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}") from None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_sha256(site: Path, module: str) -> str:
    """The sha256 pip recorded for a module's file when it installed the wheel (dist-info RECORD)."""
    rel = module.replace(".", "/") + ".py"
    for record in site.glob("speculators-*.dist-info/RECORD"):
        for line in record.read_text().splitlines():
            path, digest, _ = line.rsplit(",", 2)
            if path == rel:
                algo, b64 = digest.split("=", 1)
                return urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    raise AssertionError(f"{rel} not in RECORD")


@pytest.fixture(scope="session")
def lab_project(tmp_path_factory):
    if not shutil.which("sshd") and not Path("/usr/sbin/sshd").exists():
        pytest.fail("sshd missing: install Debian's openssh-server (the README set-up does)")
    from fleetops.lab import Lab

    project = make_project(tmp_path_factory.mktemp("proj") / "project")
    lab = Lab(project)
    lab.up(2, progress=lambda m: print(m, file=sys.stderr))
    yield project
    lab.down()


@pytest.fixture
def lab(lab_project):
    from fleetops.lab import Lab

    lab = Lab(lab_project)
    for node in lab.nodes()[:2]:  # lab01, lab02: the standard nodes; later ones carry other versions
        lab.start_node(node)
        lab.reset_packages(node)
        for sub in ("backups", "lock.json", "failpoints.json"):
            target = node.state_dir / sub
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    return lab
