"""Shared fixtures. Lab tests run against real OpenSSH sshd processes on 127.0.0.1 that these fixtures start,
and real speculators 0.3.0 / vllm 0.16.0 in the node venvs (nothing is mocked).

No silent skip: under CI=true (or FLEETOPS_NO_SKIP=1) a skipped test is reported as a failure, so a missing
sshd, base venv, GNU patch or root cannot turn CI green. Every run ends with one `summary:` line (what ran,
what was skipped and why), just above pytest's own closing line."""

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

# CI sets CI=true; FLEETOPS_NO_SKIP=1 asks for the same strictness locally.
_IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
NO_SKIP = _IN_CI or os.environ.get("FLEETOPS_NO_SKIP", "") == "1"
NO_SKIP_WHY = "CI=true" if _IN_CI else "FLEETOPS_NO_SKIP=1"
# (nodeid, reason) of every skip seen, and of those turned into failures, for the summary line.
_SKIPPED: list[tuple[str, str]] = []
_REFUSED: list[tuple[str, str]] = []

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
    """A throwaway project with a 2-node lab, stopped at the end of the session.

    FLEETOPS_TEST_LAB=DIR keeps one between runs instead (made in DIR on first use, left running), so that
    running one test file again does not pay for a new lab; never the checkout itself, whose hosts/ and .lab/
    are the operator's."""
    if not shutil.which("sshd") and not Path("/usr/sbin/sshd").exists():
        pytest.fail("sshd missing: install Debian's openssh-server (the README set-up does)", pytrace=False)
    from fleetops.lab import Lab

    kept = os.environ.get("FLEETOPS_TEST_LAB")
    if kept:
        project = Path(kept).resolve()
        if project == REPO or REPO in project.parents:
            pytest.fail(f"FLEETOPS_TEST_LAB={kept} is inside the checkout; name a directory of its own, "
                        "e.g. /tmp/fleetops-test-lab", pytrace=False)
        if not (project / "fabfile.py").exists():
            make_project(project)
    else:
        project = make_project(tmp_path_factory.mktemp("proj") / "project")
    lab = Lab(project)
    lab.up(2, progress=lambda m: print(m, file=sys.stderr))
    yield project
    if not kept:
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
        (node.faults_dir / "failpoints.json").unlink(missing_ok=True)  # armed only there (FLEETOPS_FAILPOINTS_DIR)
    return lab


@pytest.fixture(scope="session")
def lab_base() -> Path:
    """The shared lab base venv (real vllm 0.16.0 + speculators 0.3.0), asked from the lab, never hard-coded:
    its path depends on the user's cache directory and on this Python's version. Made on first use."""
    from fleetops.lab import LabError, base_dir, ensure_base

    try:
        return ensure_base(progress=lambda m: print(m, file=sys.stderr))
    except (LabError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"the lab base venv {base_dir()} could not be made: {exc}. Run `bash scripts/setup` and "
                    "`.venv/bin/python -c 'from fleetops.lab import ensure_base; ensure_base()'` (needs the "
                    "package index, ~11 GB)", pytrace=False)


@pytest.fixture(scope="session")
def base_python(lab_base: Path) -> Path:
    return lab_base / "bin" / "python"


# ---------------------------------------------------------------- no silent skip
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("root")
    if marker is not None and os.geteuid() != 0:
        why = marker.args[0] if marker.args else marker.kwargs.get("reason", "this test")
        pytest.skip(f"needs root ({why}); run as root, as CI does")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def _refuse_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = _skip_reason(report)
    _SKIPPED.append((report.nodeid, reason))
    if NO_SKIP:
        _REFUSED.append((report.nodeid, reason))
        report.outcome = "failed"
        report.longrepr = (f"skipped under {NO_SKIP_WHY}, where a skip fails the run: {reason}\n"
                           "Fix the set-up so the test runs (bash scripts/setup installs sshd and GNU patch; "
                           "CI runs as root), do not skip it.")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    # An xfail also reports as skipped; it is an expectation, not a missing component.
    if report.skipped and not hasattr(report, "wasxfail"):
        _refuse_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    if report.skipped:  # pytest.skip(allow_module_level=True), importorskip
        _refuse_skip(report)
    return report


def _grouped(entries: list[tuple[str, str]]) -> str:
    by_reason: dict[str, int] = {}
    for _nodeid, reason in entries:
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return " | ".join(f"{n}x {reason[:160]}" for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    # Outermost wrapper: this line comes after pytest's short summary (-ra) and just before its closing line.
    result = yield
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in ("passed", "failed", "error", "xfailed", "xpassed",
                                                         "deselected")}
    skipped = [(n, r) for n, r in _SKIPPED if (n, r) not in _REFUSED]
    ran = counts["passed"] + counts["failed"] + counts["xfailed"] + counts["xpassed"]
    parts = [f"{ran} ran ({counts['passed']} passed, {counts['failed']} failed)"]
    if counts["error"]:
        parts.append(f"{counts['error']} errors")
    if counts["xfailed"] or counts["xpassed"]:
        parts.append(f"{counts['xfailed']} xfailed, {counts['xpassed']} xpassed")
    if counts["deselected"]:
        parts.append(f"{counts['deselected']} deselected")
    parts.append(f"{len(skipped)} skipped" + (f": {_grouped(skipped)}" if skipped else ""))
    if _REFUSED:
        parts.append(f"{len(_REFUSED)} skips turned into failures ({NO_SKIP_WHY}): {_grouped(_REFUSED)}")
    line = "summary: " + ", ".join(parts)
    if skipped and not NO_SKIP:
        line += " (under CI=true these skips would fail the run)"
    terminalreporter.write_line(line)
    return result
