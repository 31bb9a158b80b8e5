"""The suite's tiers (tests/conftest.py): marks follow the fixtures a test uses, so the fast tier
(`-m "not lab and not base_venv"`) cannot start a lab, and a test that builds one without those
fixtures is refused by the lab itself; the no-silent-skip guard and its summary line hold under
pytest-xdist; hypothesis takes its example counts from a profile chosen by CI; a test that hangs
ends at its time limit, named.

Checked by running a real pytest, in a scratch directory, on a copy of the real conftest. None of
these runs builds a lab or needs the base venv: what they prove is that nothing gets that far."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

# Each test here needs something the fast tier must not start, and none carries a mark.
MISMARKED = '''
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.lab import Lab, ensure_base

REPO = Path(%r)


def project(top):
    """A lab project as conftest.make_project makes one (this copy of conftest is not in the \
checkout)."""
    root = top / "project"
    (root / "hosts").mkdir(parents=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks"):
        (root / name).symlink_to(REPO / name)
    return root


@pytest.fixture(scope="module")
def module_lab(lab_factory):
    with lab_factory.own("mine", 1) as lab:
        yield lab


@pytest.fixture
def as_another_user(root_user):
    yield


def test_uses_the_shared_lab(lab):
    pass


def test_uses_a_module_lab_of_its_own(module_lab):
    pass


def test_uses_the_base_venv(base_python):
    pass


def test_changes_owners(as_another_user):
    pass


def test_starts_slurm(slurm_tools):
    pass


def test_plain():
    pass


def test_builds_a_lab_by_hand(tmp_path):
    lab = Lab(project(tmp_path))
    try:
        lab.up(1)
    finally:
        lab.down(purge=True)  # were the refusal gone, no sshd would outlive the test


def test_makes_the_base_venv_by_hand():
    ensure_base()


def test_runs_lab_up_in_a_child_process(tmp_path):
    root = project(tmp_path)
    try:
        proc = subprocess.run([sys.executable, "-m", "fabric", "lab.up"], cwd=root, \
capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    finally:
        Lab(root).down(purge=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
''' % str(CONFTEST.parent.parent)
NEEDS_LAB = ["test_uses_the_shared_lab", "test_uses_a_module_lab_of_its_own"]
BY_HAND = [
    "test_builds_a_lab_by_hand",
    "test_makes_the_base_venv_by_hand",
    "test_runs_lab_up_in_a_child_process",
]

SKIPPING = """
import pytest

def test_passes():
    pass

def test_skips_in_its_body():
    pytest.skip("no widget on this machine")
"""

PROFILE = """
from hypothesis import given, settings, strategies as st

RAN = []

@given(st.integers())
def test_counts_its_examples(n):
    RAN.append(n)

def test_report():
    print(f"profile={settings.get_current_profile_name()} \
max_examples={settings.default.max_examples} ran={len(RAN)}")
"""

HANGS = """
import time

def test_hangs():
    time.sleep(60)
"""


def run_pytest(
    tmp_path: Path,
    files: dict[str, str],
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "CI",
            "FLEETOPS_NO_SKIP",
            "PYTEST_ADDOPTS",
            "HYPOTHESIS_PROFILE",
            "FLEETOPS_TEST_LAB",
            "FLEETOPS_AUDIT_LOG",
            "FLEETOPS_TEST_AUDIT_LOG",
        )
        and not k.startswith(("PYTEST_XDIST", "FLEETOPS_LAB_REFUSED", "FLEETOPS_BASE_VENV_REFUSED"))
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            *args,
        ],
        cwd=tmp_path,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def collected(proc: subprocess.CompletedProcess) -> list[str]:
    return sorted(line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line)


# ---------------------------------------------------------------- marks from fixtures
def test_every_mark_follows_from_the_fixtures_used_without_one_written(tmp_path):
    files = {"test_mismarked.py": MISMARKED}
    marked = {
        mark: collected(run_pytest(tmp_path, files, "--collect-only", "-m", mark))
        for mark in ("lab", "base_venv", "root", "slurm")
    }
    assert marked["lab"] == sorted(NEEDS_LAB), marked
    # The lab factory needs the base venv, so every lab test is a base_venv test too.
    assert marked["base_venv"] == sorted([*NEEDS_LAB, "test_uses_the_base_venv"]), marked
    assert marked["root"] == ["test_changes_owners"], marked
    assert marked["slurm"] == ["test_starts_slurm"], marked


def test_the_fast_tier_leaves_out_every_test_that_needs_the_lab_or_the_base_venv(tmp_path):
    proc = run_pytest(
        tmp_path,
        {"test_mismarked.py": MISMARKED},
        "--collect-only",
        "-m",
        "not lab and not base_venv",
    )
    assert collected(proc) == sorted(
        ["test_changes_owners", "test_starts_slurm", "test_plain", *BY_HAND]
    ), proc.stdout


def test_a_test_that_builds_the_lab_without_its_fixtures_is_refused_by_every_route(tmp_path):
    """The fast tier runs a test that reaches for the lab by hand: the lab refuses, naming the test
    and the mark it lacks, before it makes anything (no node, no base venv, nothing installed)."""
    proc = run_pytest(
        tmp_path,
        {"test_mismarked.py": MISMARKED},
        "-m",
        "not lab and not base_venv",
        "-k",
        "by_hand or child_process or plain",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "3 failed, 1 passed" in proc.stdout, proc.stdout
    for name, mark in (
        ("test_builds_a_lab_by_hand", "lab"),
        ("test_makes_the_base_venv_by_hand", "base_venv"),
        ("test_runs_lab_up_in_a_child_process", "lab"),
    ):
        assert f"test_mismarked.py::{name} uses " in proc.stdout, proc.stdout
        assert f"but is not marked `{mark}`" in proc.stdout, proc.stdout
    assert not list(tmp_path.rglob(".lab/nodes")), "a node was made"


# ---------------------------------------------------------------- no silent skip, on several
# workers
def test_under_xdist_a_skip_still_fails_ci_and_the_summary_names_it(tmp_path):
    local = run_pytest(tmp_path, {"test_skipping.py": SKIPPING}, "-n", "2")
    assert local.returncode == 0, local.stdout + local.stderr
    assert (
        "summary: 1 ran (1 passed, 0 failed), 1 skipped: 1x no widget on this machine"
        in local.stdout
    )
    ci = run_pytest(tmp_path, {"test_skipping.py": SKIPPING}, "-n", "2", env={"CI": "true"})
    assert ci.returncode == 1, ci.stdout + ci.stderr
    lines = [line for line in ci.stdout.splitlines() if line.strip()]
    assert lines[-2].startswith(
        "summary: 2 ran (1 passed, 1 failed), 0 skipped, 1 skips turned into failures "
        "(CI=true): 1x no widget on this machine"
    ), ci.stdout
    assert lines[-1].startswith("1 failed, 1 passed in "), ci.stdout


AUDIT_PATH = """
import os
import time
from pathlib import Path

def test_where_this_worker_audits():
    time.sleep(0.5)  # long enough that the other worker takes the next file
    worker = os.environ.get("PYTEST_XDIST_WORKER", "none")
    (Path(__file__).parent / \
f"audit-{worker}-{Path(__file__).stem}").write_text(os.environ["FLEETOPS_AUDIT_LOG"])
"""


def test_each_xdist_worker_appends_to_an_audit_log_of_its_own(tmp_path):
    files = {f"test_audit_{i}.py": AUDIT_PATH for i in range(4)}
    proc = run_pytest(tmp_path, files, "-n", "2", "--dist", "loadfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_worker: dict[str, set[str]] = {}
    for seen in tmp_path.glob("audit-gw*"):
        by_worker.setdefault(seen.name.split("-")[1], set()).add(seen.read_text())
    assert len(by_worker) == 2, by_worker
    (first,), (second,) = by_worker.values()
    assert first != second and "fleetops-audit-" in first and "fleetops-audit-" in second, by_worker


# ---------------------------------------------------------------- hypothesis profiles
@pytest.mark.parametrize(
    "env,profile,examples",
    [({}, "dev", 30), ({"CI": "true"}, "ci", 300), ({"HYPOTHESIS_PROFILE": "ci"}, "ci", 300)],
)
def test_hypothesis_examples_come_from_the_profile_ci_selects(tmp_path, env, profile, examples):
    proc = run_pytest(tmp_path, {"test_profile.py": PROFILE}, "-s", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"profile={profile} max_examples={examples} ran={examples}" in proc.stdout, proc.stdout


# ---------------------------------------------------------------- per-test time limit
def test_a_hanging_test_fails_at_its_time_limit_and_says_how_to_raise_it(tmp_path):
    proc = run_pytest(tmp_path, {"test_hangs.py": HANGS}, "--timeout", "2", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "test_hangs.py::test_hangs" in proc.stdout
    assert "ran past its time limit of 2 s" in proc.stdout, proc.stdout
    assert "@pytest.mark.timeout(" in proc.stdout, proc.stdout
