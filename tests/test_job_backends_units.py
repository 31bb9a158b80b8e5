"""The job backends' shape: which backend runs a host's jobs is chosen in one place
(tasks/jobs/backend.py), so no module outside it compares a scheduler, and a backend is added by
registering it, with no table edited."""

from __future__ import annotations

import ast
from pathlib import Path

from fleetops.plans.host import Host
from fleetops.tasks.jobs import JobBackend, backend_for, backend_of_record, register, unregister
from fleetops.tasks.jobs.slurm import SLURM
from fleetops.tasks.jobs.ssh import SSH

REPO = Path(__file__).resolve().parent.parent
# The one function that chooses a host's backend (and reads a job record's kind); and the inventory
# reader, which refuses a Slurm setting on a host without `scheduler: slurm` (a check of the file,
# not a branch on how jobs run).
ALLOWED = {"fleetops/tasks/jobs/backend.py", "fleetops/plans/inventoryfile.py"}
BACKEND_NAMES = {"SLURM", "SSH", "SlurmJobs", "SshJobs"}


def _names_a_backend(node: ast.AST) -> bool:
    """A scheduler's word, a host's or a record's scheduler, or a built-in backend by name."""
    if isinstance(node, ast.Constant) and node.value == "slurm":
        return True
    if isinstance(node, ast.Attribute) and node.attr in ("scheduler", *BACKEND_NAMES):
        return True
    if isinstance(node, ast.Name) and node.id in BACKEND_NAMES:
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "scheduler"
    )


def scheduler_branches(root: Path) -> list[str]:
    """Every comparison against a scheduler (or a built-in backend, or an isinstance test of one) in
    fleetops/ under `root`, outside ALLOWED: `path:line: code`."""
    found = []
    for path in sorted((root / "fleetops").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if isinstance(node, ast.Compare):
                hit = any(_names_a_backend(x) for x in (node.left, *node.comparators))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
            ):
                hit = (
                    any(_names_a_backend(x) for x in ast.walk(node.args[1]))
                    if len(node.args) == 2
                    else False
                )
            else:
                hit = False
            if hit:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_backend_choice_branches_on_the_scheduler():
    assert scheduler_branches(REPO) == []


def test_the_scan_finds_a_scheduler_branch(tmp_path):
    # The scan itself: each way of branching on the scheduler it must see, in a module outside the
    # backends.
    (tmp_path / "fleetops" / "tasks").mkdir(parents=True)
    (tmp_path / "fleetops" / "tasks" / "x.py").write_text(
        "def f(node, job, b):\n"
        "    if node.host.scheduler == 'slurm':\n        return 1\n"
        "    if job.get('scheduler') != 'slurm':\n        return 2\n"
        "    if b is SLURM or isinstance(b, (SshJobs, int)):\n        return 3\n",
        encoding="utf-8",
    )
    assert [line.split(": ", 1)[0] for line in scheduler_branches(tmp_path)] == [
        "fleetops/tasks/x.py:2",
        "fleetops/tasks/x.py:4",
        "fleetops/tasks/x.py:6",
        "fleetops/tasks/x.py:6",
    ]


def _host(name: str, scheduler: str | None = None) -> Host:
    return Host(name, "127.0.0.1", scheduler=scheduler)


def test_a_host_gets_its_backend_from_its_scheduler_and_a_record_from_its_kind():
    assert backend_for(_host("n1")) is SSH
    assert backend_for(_host("login01", "slurm")) is SLURM
    assert backend_of_record({"id": "a", "scheduler": "slurm"}) is SLURM
    assert backend_of_record({"id": "a"}) is SSH
    # unknown kind: shown as written
    assert backend_of_record({"id": "a", "scheduler": "elsewhere"}) is SSH
    assert SSH.shards_by_host and not SSH.allocates
    assert not SLURM.shards_by_host and SLURM.allocates


class _Named(JobBackend):
    """A backend that claims one host by name (every task answered by the node's job_status op)."""

    scheduler = "named-in-a-test"

    def __init__(self, name: str) -> None:
        self.name = name

    def handles(self, host: Host) -> bool:
        return host.name == self.name

    def launch(self, run, plan, node):  # type: ignore[no-untyped-def]
        raise AssertionError("not asked")

    status = tail = logs = stop = launch


def test_a_registered_backend_is_asked_first_and_unregistering_restores_the_choice():
    extra = register(_Named("n1"))
    try:
        assert backend_for(_host("n1")) is extra
        assert backend_for(_host("n2")) is SSH
        assert backend_of_record({"id": "a", "scheduler": "named-in-a-test"}) is extra
    finally:
        unregister(extra)
    assert backend_for(_host("n1")) is SSH


def test_shards_all_on_a_backend_that_shards_inside_its_host_is_refused_before_the_node_is_asked(
    tmp_path,
):
    from types import SimpleNamespace

    from fleetops.state import RunState
    from fleetops.tasks.jobs import shards
    from fleetops.tasks.plan import Plan

    # no call(): the refusal asks the node nothing
    node = SimpleNamespace(host=_host("login01", "slurm"))
    for raw, given in ((True, "--shards"), ("all", "--shards all")):
        result = shards.launch(
            RunState(tmp_path, {}),
            Plan("extract", {}, 60, None, options={"shards": raw}),
            node,
            backend_for(node.host),
        )  # type: ignore[arg-type]
        assert (result.code, result.msg) == (
            2,
            f"{given} on a Slurm login node needs the number of shards (the "
            "job array's size), e.g. --shards 4",
        ), result


BACKEND_FILES = ["fleetops/tasks/jobs/ssh.py", "fleetops/tasks/jobs/slurm/jobs.py"]


def _shared_import_lines(path: Path) -> dict[str, set[str]]:
    """module → names a backend file imports from the jobs helpers both backends use (plan,
    reconnect, backend)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[-1]
            in ("plan", "reconnect", "backend", "jobsummary", "tables", "versions")
        ):
            out.setdefault(node.module, set()).update(a.name for a in node.names)
    return out


def test_both_backends_take_what_they_share_from_one_place():
    """The helpers both backends use (tasks/plan.py's, reconnect's, backend's) come from
    jobs/common.py and the results they give alike (logs, a tail's end) from results/jobs.py:
    neither backend imports or builds them itself."""
    from fleetops.tasks.jobs import common

    shared = set(common.__all__)
    for rel in BACKEND_FILES:
        direct = {name for names in _shared_import_lines(REPO / rel).values() for name in names}
        assert not direct & shared, (
            f"{rel} imports {sorted(direct & shared)} itself: jobs/common.py names them"
        )
        for call in ast.walk(ast.parse((REPO / rel).read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "Result"
                and len(call.args) > 1
                and isinstance(call.args[1], ast.Constant)
            ):
                assert call.args[1].value not in ("logs", "tail"), (
                    f"{rel}:{call.lineno}: a {call.args[1].value} result built by hand "
                    "(results/jobs.py builds it)"
                )


def test_the_results_both_backends_give_alike_are_one_type():
    from fleetops.results.jobs import JobLogs, logs_result

    ssh = logs_result("n1", "7", "running", 2, "/var/lib/fleetops/jobs/7/log", ["a", "b"])
    slurm = logs_result("login01", "7", "running", 2, "a.out, b.out", [["a"], ["b"]])
    assert type(ssh.payload) is type(slurm.payload) is JobLogs
    assert ssh.to_json()["data"] == {"lines": ["a", "b"], "state": "running"}
    assert ssh.msg == "job 7 (running): last 2 lines of /var/lib/fleetops/jobs/7/log"
