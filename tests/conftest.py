"""Shared fixtures. Lab tests run against real OpenSSH sshd processes on 127.0.0.1 that these
fixtures start, and real speculators 0.3.0 / vllm 0.16.0 in the node venvs (nothing is mocked).

Marks follow what a test uses: a test whose fixtures (directly or through other fixtures) include
the lab factory is marked `lab`, the base venv `base_venv`, root `root`, Slurm `slurm`
(FIXTURE_MARKS below), so the fast tier (`-m "not lab and not base_venv"`) never starts a lab, and a
test that builds one without those fixtures is refused by the lab itself
(fleetops.lab.common.REFUSE_LAB).

Labs come from one factory (`lab_factory`): one lab per size for the whole run, shared by every
module that needs that size and restored between them by putting files back; a module whose changes
a restore cannot undo gets a lab of its own.

No silent skip: under CI=true (or FLEETOPS_NO_SKIP=1) a skipped test is reported as a failure, so a
missing sshd, base venv, GNU patch or root cannot turn CI green. Every run ends with one `summary:`
line (what ran, what was skipped and why), just above pytest's own closing line."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from base64 import urlsafe_b64decode
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

import fleetops.agent

# The tests run the agent by the node's name. The checkout's remote_scripts/ is found when the
# working directory or PYTHONPATH is the checkout; otherwise (an installed fleetops, a scratch
# directory) it is fleetops' own agent.
if importlib.util.find_spec("remote_scripts") is None:
    sys.modules["remote_scripts"] = fleetops.agent
import fleetops.agent.core.bootstrap
import fleetops.agent.core.launch
from remote_scripts.core import bootstrap, launch

if TYPE_CHECKING:
    import terminal

    from fleetops.lab import Lab

# What the bootstrap hands in at every agent start: the node's writer (atomicio), run in-process by
# the tests, opens where it writes by the same walk as on a node; the same for the client's copy
# (fleetops.agent: the lab stops jobs with it).
launch.PATHS = (bootstrap.walk, bootstrap.Rules)
fleetops.agent.core.launch.PATHS = (
    fleetops.agent.core.bootstrap.walk,
    fleetops.agent.core.bootstrap.Rules,
)

# CI sets CI=true; FLEETOPS_NO_SKIP=1 asks for the same strictness locally.
_IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
NO_SKIP = _IN_CI or os.environ.get("FLEETOPS_NO_SKIP", "") == "1"
NO_SKIP_WHY = "CI=true" if _IN_CI else "FLEETOPS_NO_SKIP=1"

# Hypothesis example counts: `ci` as many as the suite has always run (CI=true selects it), `dev` a
# tenth, for the one-minute loop after each edit; HYPOTHESIS_PROFILE (or --hypothesis-profile) names
# one outright.
hypothesis_settings.register_profile("ci", max_examples=300, print_blob=True)
hypothesis_settings.register_profile("dev", max_examples=30)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _IN_CI else "dev")
)

REPO = Path(__file__).resolve().parent.parent
# Tests append to their own audit log, never to the operator's
# (~/.local/state/fleetops/audit.jsonl): one per pytest process. An xdist worker inherits the
# controller's (FLEETOPS_TEST_AUDIT_LOG says it is the suite's own, not one the operator chose) and
# makes its own, or tests counting audit lines would count the other worker's.
if os.environ.get("FLEETOPS_AUDIT_LOG") in (None, os.environ.get("FLEETOPS_TEST_AUDIT_LOG")):
    os.environ["FLEETOPS_AUDIT_LOG"] = os.environ["FLEETOPS_TEST_AUDIT_LOG"] = str(
        Path(tempfile.mkdtemp(prefix="fleetops-audit-")) / "audit.jsonl"
    )
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"


def make_project(root: Path) -> Path:
    """A throwaway copy of the project layout (fabfile, config, playbooks) with its own hosts/ and
    .lab/."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("fabfile.py", "fabric.yaml", "playbooks"):
        (root / name).symlink_to(REPO / name)
    (root / "hosts").mkdir()
    (root / "tests").symlink_to(REPO / "tests")
    return root


def copy_playbooks(project: Path) -> None:
    """The project's playbooks/ as a real copy instead of a link to the checkout's: for tests that
    write there."""
    link = project / "playbooks"
    if link.is_symlink():
        link.unlink()
        shutil.copytree(REPO / "playbooks", link)


def run_fab(
    project: Path,
    *args: str,
    env: dict | None = None,
    timeout: float = 900,
    check: bool = False,
    drop: tuple[str, ...] = (),
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """`drop`: variables of the test's environment fab must not see (an operator's ssh-agent, say);
    `input`: what fab reads on its stdin (a password it asks for)."""
    inherited = {k: v for k, v in os.environ.items() if k not in drop}
    full_env = {**inherited, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        input=input,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fab {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def fab_json(project: Path, *args: str, **kw) -> tuple[int, dict]:
    proc = run_fab(project, *args, "--json", **kw)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON from fab {args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        ) from None


def fab_json_output(
    project: Path,
    *args: str,
    timeout: float = 600,
    env: dict | None = None,
    drop: tuple[str, ...] = (),
    input: str | None = None,
) -> tuple[int, dict, str]:
    """fab_json, plus the whole output (stdout + stderr), in which no traceback may appear."""
    proc = run_fab(project, *args, "--json", timeout=timeout, env=env, drop=drop, input=input)
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    try:
        return proc.returncode, json.loads(proc.stdout), both
    except ValueError:
        raise AssertionError(f"no JSON from fab {args}: rc={proc.returncode}\n{both}") from None


def sha256(path: Path) -> str:
    """hashlib's sha256 of the file, read in 1 MiB chunks (fetch tests hash files of hundreds of
    MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_sha256(site: Path, module: str) -> str:
    """The sha256 pip recorded for a module's file when it installed the wheel (dist-info
    RECORD)."""
    rel = module.replace(".", "/") + ".py"
    for record in site.glob("speculators-*.dist-info/RECORD"):
        for line in record.read_text().splitlines():
            path, digest, _ = line.rsplit(",", 2)
            if path == rel:
                algo, b64 = digest.split("=", 1)
                return urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    raise AssertionError(f"{rel} not in RECORD")


def cmdlines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process this user may read now (/proc); one gone meanwhile is
    skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        yield int(entry), words


def ssh_processes(folder: str) -> list[int]:
    """Every ssh process whose command line names this control directory: masters, sessions on them
    (an `ssh` started for one), a login not yet done, and a start that lost the race for its socket
    and ran on as a plain connection (ssh_masters sees only masters that listen)."""
    return [
        pid
        for pid, words in cmdlines()
        if os.path.basename(words[0]) == b"ssh" and any(folder.encode() in w for w in words)
    ]


def ssh_masters(directory: str | Path | None = None) -> dict[int, str]:
    """pid → socket of every ssh master in the control directory (FLEETOPS_CONTROL_DIR, else the one
    fleetops would use), by two independent readings: `ssh -O check` on each socket, and every
    process of this user listening on a socket there (/proc: it finds a master whose socket file was
    removed too). For the suite's end: a run must leave none (`assert not ssh_masters(...)`)."""
    from fleetops.wire import controldir, masters

    if directory is None:
        try:
            directory = controldir.control_dir(create=False)
        except controldir.ControlDirError:
            return {}
    found = {m.pid: m.socket for m in masters.masters(str(directory)) if m.pid}
    found.update(
        {
            pid: os.path.basename(path)
            for pid, path in masters.listening_pids(str(directory)).items()
        }
    )
    return found


def on_openssh() -> bool:
    """Whether this suite's runs reach the lab through the system `ssh` (FLEETOPS_TRANSPORT,
    `scripts/test --transport openssh`): a host's master then outlives each run, and the next run
    within its persist window logs in no more."""
    from fleetops.wire.transports import DEFAULT, TRANSPORT_ENV

    return (os.environ.get(TRANSPORT_ENV) or DEFAULT) == "openssh"


def disconnect_all() -> None:
    """Close every master in this suite's control directory, as `fleet disconnect` does, each one
    waited for: the next run logs in afresh (and a node's sshd config, changed since, applies to
    it)."""
    from fleetops.wire import masters

    done = masters.disconnect(None)
    failed = [c for c in done["closed"] if c["outcome"] == "failed"]
    assert not done["error"] and not failed, done


# ---------------------------------------------------------------- labs What make_project links to
# the checkout; a restored project has these, hosts/lab.yaml and .lab/, nothing else.
PROJECT_LINKS = ("fabfile.py", "fabric.yaml", "playbooks", "tests")
Layout = Callable[[Path], None]


class LabFactory:
    """Every lab of one pytest run (one per pytest-xdist worker).

    `shared(size, user)`: the run's lab of that size, built on first use and kept until the run
    ends, handed to one user (a test module) after another. When the user changes it is restored to
    what `lab.up` left (the nodes by Lab.restore, the project by restore_project): files are put
    back, nothing is reinstalled, so a module cannot see what an earlier one did. `own(name, size)`:
    a lab for one module alone, for changes a restore cannot undo (owners, mounts, a stopped lab),
    gone when the module ends.

    FLEETOPS_TEST_LAB=DIR keeps every lab between runs instead (made on first use, left running), so
    that running one test file again does not pay for new labs: the 2-node lab is DIR itself, the
    others are beside it (DIR-<name>); never inside the checkout, whose hosts/ and .lab/ are the
    operator's."""

    def __init__(self, top: Path, kept: Path | None) -> None:
        self.top = top
        self.kept = kept
        self._shared: dict[int, Lab] = {}
        self._user: dict[int, str] = {}

    def project_dir(self, name: str, reachable: bool = False) -> Path:
        if self.kept is not None:
            return (
                self.kept if name == "shared-2" else self.kept.with_name(f"{self.kept.name}-{name}")
            )
        # pytest's temp directories are 0700: no other user could reach the nodes' files
        if reachable:
            top = Path(tempfile.mkdtemp(prefix=f"fleetops-{name}-", dir="/tmp"))
            top.chmod(0o755)
            return top / "project"
        # A fresh directory per lab: two modules may ask for an own lab of the same name.
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.top)) / "project"

    def build(
        self, name: str, size: int, layout: Layout | None = None, reachable: bool = False
    ) -> Lab:
        from fleetops.lab import Lab

        project = self.project_dir(name, reachable)
        if not (project / "fabfile.py").exists():
            make_project(project)
            if layout is not None:
                layout(project)
        lab = Lab(project)
        lab.up(size, progress=lambda m: print(m, file=sys.stderr))
        return lab

    def shared(self, size: int, user: str, layout: Layout | None = None) -> Lab:
        """The run's `size`-node lab for `user`, restored first when someone else (or no one yet: a
        kept lab may be as a previous run left it) had it; `layout(project)` then adds the user's
        own files."""
        lab = self._shared.get(size)
        if lab is None:
            lab = self._shared[size] = self.build(f"shared-{size}", size)
        if self._user.get(size) != user:
            restore_project(lab.root)
            lab.restore(size)
            if layout is not None:
                layout(lab.root)
            self._user[size] = user
        return lab

    @contextmanager
    def own(
        self, name: str, size: int, layout: Layout | None = None, reachable: bool = False
    ) -> Iterator[Lab]:
        """A lab for one module alone (its nodes get changes no restore undoes), stopped when the
        module ends. `layout(project)` adds files to the project before the lab first comes up;
        `reachable` puts it under directories every user may enter (for tests that act as another
        user)."""
        lab = self.build(name, size, layout, reachable)
        try:
            yield lab
        finally:
            if self.kept is None:
                lab.down(purge=True)
                if reachable:
                    shutil.rmtree(lab.root.parent, ignore_errors=True)

    def close(self) -> None:
        if self.kept is None:
            for lab in self._shared.values():
                lab.down(purge=True)


def restore_project(project: Path) -> None:
    """A lab project as make_project and `lab.up` leave it: the links to the checkout,
    hosts/lab.yaml, .lab/."""
    for entry in project.iterdir():
        if entry.name not in (*PROJECT_LINKS, "hosts", ".lab"):
            _remove(entry)
    for name in PROJECT_LINKS:
        link = project / name
        if not (link.is_symlink() and Path(os.readlink(link)) == REPO / name):
            _remove(link)
            link.symlink_to(REPO / name)
    (project / "hosts").mkdir(exist_ok=True)
    for entry in (project / "hosts").iterdir():
        if entry.name != "lab.yaml":  # rewritten by Lab.restore
            _remove(entry)


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _kept_lab_dir() -> Path | None:
    kept = os.environ.get("FLEETOPS_TEST_LAB")
    if not kept:
        return None
    project = Path(kept).resolve()
    if project == REPO or REPO in project.parents:
        pytest.fail(
            f"FLEETOPS_TEST_LAB={kept} is inside the checkout; name a directory of its own, "
            "e.g. /tmp/fleetops-test-lab",
            pytrace=False,
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return project.with_name(f"{project.name}-{worker}") if worker else project


@pytest.fixture(scope="session")
def lab_factory(lab_base, tmp_path_factory) -> Iterator[LabFactory]:
    """The run's lab factory (see LabFactory). Every lab fixture goes through it: a test that uses
    it, however indirectly, is marked `lab` (FIXTURE_MARKS)."""
    if not shutil.which("sshd") and not Path("/usr/sbin/sshd").exists():
        pytest.fail(
            "sshd missing: install Debian's openssh-server (the README set-up does)", pytrace=False
        )
    factory = LabFactory(tmp_path_factory.mktemp("labs"), _kept_lab_dir())
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def lab_project(lab_factory: LabFactory) -> Path:
    """The project of the run's 2-node lab (LabFactory.shared), stopped at the end of the run (kept
    with FLEETOPS_TEST_LAB)."""
    return lab_factory.shared(2, "lab_project").root


@pytest.fixture
def lab(lab_project, lab_factory: LabFactory, request: pytest.FixtureRequest) -> Lab:
    """The run's 2-node lab, restored if another module had it, with both nodes' packages pristine
    and no backup, lock or failpoint left by the test before."""
    lab = lab_factory.shared(2, request.module.__name__)
    for node in lab.nodes():
        lab.start_node(node)
        lab.reset_packages(node)
        for sub in ("backups", "lock.json", "failpoints.json"):
            _remove(node.state_dir / sub)
        # armed only there (FLEETOPS_FAILPOINTS_DIR)
        (node.faults_dir / "failpoints.json").unlink(missing_ok=True)
    return lab


@pytest.fixture
def term(lab: Lab) -> Iterator[terminal.Terminal]:
    """A real 80x40 terminal (tmux) whose shell starts in the lab's project: what the operator sees
    and types."""
    # here: the suite-tier tests copy this conftest alone into projects of their own
    import terminal

    if not terminal.available():
        pytest.skip("needs tmux (Debian's tmux package; scripts/setup installs it)")
    with terminal.Terminal(lab.root) as t:
        yield t


@pytest.fixture(scope="session")
def lab_base() -> Path:
    """The shared lab base venv (real vllm 0.16.0 + speculators 0.3.0), asked from the lab, never
    hard-coded: its path depends on the user's cache directory and on this Python's version. Made on
    first use."""
    from fleetops.lab import LabError, base_dir, ensure_base

    try:
        return ensure_base(progress=lambda m: print(m, file=sys.stderr))
    except (LabError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(
            f"the lab base venv {base_dir()} could not be "
            f"made: {exc}. Run `bash scripts/setup` and "
            "`.venv/bin/python -c 'from fleetops.lab "
            "import ensure_base; ensure_base()'` (needs the "
            "package index, ~11 GB)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def newer_base(lab_base: Path) -> Path:
    """The lab's second base venv (fleetops.lab.common.NEWER_NODE_PACKAGES: a newer real vLLM with
    its real dependencies, ~11 GB), for a node on the new version: built on first use like the
    default base (~10 minutes on 2 cores), cached after that; scripts/test builds it before the
    workers start."""
    from fleetops.lab.common import NEWER_NODE_PACKAGES, LabError, base_dir_for, ensure_base_for

    try:
        return ensure_base_for(
            dict(NEWER_NODE_PACKAGES), progress=lambda m: print(m, file=sys.stderr)
        )
    except (LabError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(
            "the lab's second base venv "
            f"{base_dir_for(dict(NEWER_NODE_PACKAGES))} could not be made: {exc}. "
            "Run `.venv/bin/fab lab.build-base --vllm "
            f"{NEWER_NODE_PACKAGES['vllm']}` (needs the package index, ~11 GB)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def base_python(lab_base: Path) -> Path:
    return lab_base / "bin" / "python"


@pytest.fixture(scope="session")
def root_user() -> None:
    """Asked for by a fixture that needs root (a chown to another user, a mount, daemons that run as
    root): every test using it is marked `root`, so it is skipped for another user outside CI and
    fails under CI=true."""
    # only reached when marks were bypassed: the `root` mark skips before any set-up
    if os.geteuid() != 0:
        pytest.fail("needs root", pytrace=False)


@pytest.fixture(scope="session")
def slurm_tools() -> None:
    """Slurm's daemons and commands are installed (a test cluster is started from them:
    fleetops/lab/slurm.py)."""
    from fleetops.lab.slurm import missing_binaries

    if missing_binaries():
        pytest.fail(
            f"Slurm missing: {missing_binaries()}; bash "
            "scripts/setup installs Debian's slurmctld slurmd "
            "munge slurm-client",
            pytrace=False,
        )


# ---------------------------------------------------------------- marks from what a test uses A
# fixture's needs, as the marks of every test whose fixtures include it (directly or through other
# fixtures): a test cannot use the lab and miss the `lab` mark. lab_factory needs lab_base, so a lab
# test is also `base_venv`. Marks given by hand stay (a `root` mark's reason names the test's own
# need).
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "lab_factory": ("lab",),
    "lab_base": ("base_venv",),
    "newer_base": ("base_venv",),
    "root_user": ("root",),
    "slurm_tools": ("slurm",),
}
MARKERS = [
    (
        "lab: needs the local SSH lab (real sshd, real "
        "vllm/speculators); given to every test using lab_factory"
    ),
    "base_venv: needs the lab base venv (vllm 0.16.0 + speculators 0.3.0, ~11 GB, "
    "fleetops.lab.ensure_base); given to every test using lab_base (every lab test too)",
    "root(reason): needs root; skipped for another user outside CI (named in the summary line), "
    "a failure under CI=true; given to every test using root_user",
    (
        "slurm: starts a one-node Slurm (Debian's slurmctld, "
        "slurmd, munge); given to every test using slurm_tools"
    ),
    (
        "matrix: runs the client's tests on another Python (tests/clientmatrix.py): the whole "
        "suite, not the fast tier"
    ),
]


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    _own_control_dir()


# The OpenSSH transport's master connections: this session's own short directory (a socket path must
# fit: controldir.MAX_DIR_CHARS), every master in it closed at the end, and none left running.
_CONTROL_DIR: list[str] = []


def _own_control_dir() -> None:
    if os.environ.get("FLEETOPS_CONTROL_DIR") and _CONTROL_DIR:
        return
    folder = tempfile.mkdtemp(prefix="fo-cm-", dir="/tmp")
    os.chmod(folder, 0o700)
    os.environ["FLEETOPS_CONTROL_DIR"] = folder
    _CONTROL_DIR.append(folder)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for folder in _CONTROL_DIR:
        if not os.path.isdir(folder):
            continue
        from fleetops.wire import masters

        # each one waited for until it has exited
        masters.close_all(folder, masters.masters(folder))
        left = ssh_masters(folder)
        # an ssh naming the directory that is no master (a start that lost a race ran on as one)
        strays = [pid for pid in ssh_processes(folder) if pid not in left]
        for pid in strays:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)
        if left or strays:
            print(
                f"\nssh processes left running after the suite: masters {left}, others {strays}",
                file=sys.stderr,
            )
            session.exitstatus = 1


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marks in FIXTURE_MARKS.items():
            if fixture not in used:
                continue
            for name in marks:
                if item.get_closest_marker(name) is None:
                    item.add_marker(
                        getattr(pytest.mark, name)(f"a fixture it uses needs {fixture}")
                        if name == "root"
                        else getattr(pytest.mark, name)
                    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test not marked `lab` (or `base_venv`) may not build a lab (or the base venv) by any route:
    the lab refuses while these variables name the test (child processes inherit them)."""
    from fleetops.lab.common import REFUSE_BASE, REFUSE_LAB

    saved = {var: os.environ.get(var) for var in (REFUSE_LAB, REFUSE_BASE)}
    if item.get_closest_marker("lab") is None:
        os.environ[REFUSE_LAB] = item.nodeid
        if item.get_closest_marker("base_venv") is None:
            os.environ[REFUSE_BASE] = item.nodeid
    try:
        return (yield)
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


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
    # Kept on the report itself: under pytest-xdist it is made in a worker and summarised by the
    # controller, which gets the report's attributes and nothing else.
    report.fleetops_skip = reason
    if NO_SKIP:
        report.fleetops_refused = True
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under {NO_SKIP_WHY}, where a skip fails the run: {reason}\n"
            "Fix the set-up so the test runs (bash scripts/setup installs sshd and GNU patch; "
            "CI runs as root), do not skip it."
        )


_TIMED_OUT = re.compile(r"Timeout \(>([0-9.]+)s\) from pytest-timeout")


def _explain_timeout(report: pytest.TestReport) -> None:
    """pytest-timeout's failure, said plainly: which test, what limit, how to give it more (a lab
    test on a loaded machine may need it; a hang needs a fix)."""
    text = str(report.longrepr)
    found = _TIMED_OUT.search(text)
    if found:
        limit = float(found.group(1))
        report.longrepr = (
            f"{text}\n\n{report.nodeid} ran past its time limit of {limit:g} s ({report.when}); "
            "the stacks above show where it was. If it is only slow, give it more with "
            "@pytest.mark.timeout(SECONDS) on the test, or --timeout=SECONDS for a run "
            "(pyproject.toml sets the default)."
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        _explain_timeout(report)
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
    return " | ".join(
        f"{n}x {reason[:160]}" for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1])
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    # Outermost wrapper: this line comes after pytest's short summary (-ra) and just before its
    # closing line.
    result = yield
    stats = terminalreporter.stats
    counts = {
        key: len(stats.get(key, []))
        for key in ("passed", "failed", "error", "xfailed", "xpassed", "deselected")
    }
    seen = [
        rep
        for reports in stats.values()
        for rep in reports
        if getattr(rep, "fleetops_skip", None) is not None
    ]
    skipped = [
        (rep.nodeid, rep.fleetops_skip)
        for rep in seen
        if not getattr(rep, "fleetops_refused", False)
    ]
    refused = [
        (rep.nodeid, rep.fleetops_skip) for rep in seen if getattr(rep, "fleetops_refused", False)
    ]
    ran = counts["passed"] + counts["failed"] + counts["xfailed"] + counts["xpassed"]
    parts = [f"{ran} ran ({counts['passed']} passed, {counts['failed']} failed)"]
    if counts["error"]:
        parts.append(f"{counts['error']} errors")
    if counts["xfailed"] or counts["xpassed"]:
        parts.append(f"{counts['xfailed']} xfailed, {counts['xpassed']} xpassed")
    if counts["deselected"]:
        parts.append(f"{counts['deselected']} deselected")
    parts.append(f"{len(skipped)} skipped" + (f": {_grouped(skipped)}" if skipped else ""))
    if refused:
        parts.append(
            f"{len(refused)} skips turned into failures ({NO_SKIP_WHY}): {_grouped(refused)}"
        )
    line = "summary: " + ", ".join(parts)
    if skipped and not NO_SKIP:
        line += " (under CI=true these skips would fail the run)"
    terminalreporter.write_line(line)
    return result
