"""Client start-up and per-host cost, without a lab: a host task's command line does not load the
lab collection, the local tasks' report modules or (for `fab --list`) the run and rich; the lab
tasks are still there whenever the command line may name one or lists the tasks; a Fabric Connection
built for a host writes nothing into its config (each write re-merges the whole config: client CPU
per host)."""

from __future__ import annotations

import json
import os
import sys
from subprocess import CompletedProcess

import pytest
from clientprobe import run_python
from conftest import REPO

from fleetops.fab.loading import wants_lab


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["fab", "-H", "lab01", "patch", "verify"], False),
        (["fab", "-H", "lab01", "patch", "verify", "--kinds", "grep,compile"], False),
        (["fab", "--hosts", "lab[01-03]", "ping"], False),
        # the ad-hoc command's words are not tasks
        (["fab", "-H", "lab01", "--", "ls", "lab.txt"], False),
        (["fleet", "-H", "n1", "gpu", "--wait", "60"], False),
        (["fab", "lab.up", "--nodes", "2"], True),
        (["fab", "lab"], True),
        (["fab", "labup"], True),  # a typo: its "did you mean lab.up" needs the lab's tasks
        (["fab", "--list"], True),
        (["fab", "-l"], True),
        (["fab", "--list-format=json"], True),
        (["fab", "--help", "patch"], True),
        (["fab", "-h"], True),
        (["fab", "--complete", "--", "fab", "la"], True),
        (["/x/site-packages/fabric/__main__.py", "-H", "lab01", "ping"], False),  # python -m fabric
        (["-c"], True),  # the fabfile imported by a script or a test: every task
        (["pytest", "-H", "lab01", "ping"], True),
        ([], True),
    ],
)
def test_lab_collection_only_when_the_command_line_may_name_it(argv, wanted):
    assert wants_lab(argv) is wanted


def _modules_after(argv: list[str], body: str) -> dict:
    probe = (
        f"import sys, json\nsys.argv = {argv!r}\n{body}\n"
        "print(json.dumps({'lab': 'fleetops.lab' in "
        "sys.modules, 'run': 'fleetops.run' in sys.modules,"
        " 'rich': 'rich' in sys.modules, 'history': 'fleetops.report.history' in sys.modules,"
        " 'tasks': sorted(ns.task_names) if 'ns' in globals() else []}))"
    )
    proc = run_python("-c", probe)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_host_task_loads_no_lab_and_no_local_report_modules():
    seen = _modules_after(["fab", "-H", "lab01", "patch", "verify"], "from fabfile import ns")
    assert not seen["lab"] and not seen["history"]
    assert (
        "patch" in seen["tasks"] and "history" in seen["tasks"] and "playbook.lint" in seen["tasks"]
    )
    assert not any(t.startswith("lab.") for t in seen["tasks"])


def test_a_run_loads_no_progress_bars_and_no_uuid():
    # rich.progress (rich.live, spinners) only when `fetch` draws a bar; uuid (and the platform
    # module it imports) not at all: temp names come from os.urandom
    probe = (
        "import sys, fleetops.cli, fleetops.run, fleetops.wire.ssh, fleetops.report.oncall\nfrom "
        "fleetops.tasks.registry import TASKS\nspecs = [TASKS[name] for name in TASKS]  # every "
        "family loaded\nprint(sorted(m for m in ('rich.progress', 'rich.live', 'uuid', "
        "'platform') if m in sys.modules))"
    )
    proc = run_python("-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_run_loads_the_kernel_log_and_gpu_health_parsers_only_for_diagnose():
    # The task table imported diagnose's parsers (the Xid table, ~13 regexes,
    # xml.etree) for every run, ~15 ms of start-up that only `diagnose` uses.
    probe = (
        "import sys, fleetops.cli, fleetops.run, fleetops.tasks.diagnose\nnames = "
        "('fleetops.plans.kernellog', 'fleetops.plans.gpuhealth', 'xml.etree.ElementTree')\n"
        "print(sorted(m for m in names if m in sys.modules))\nfrom fleetops.tasks import "
        "diagnose\nprint(diagnose.kernel_findings('h', {'lines': [], 'source': 'dmesg', "
        "'total_lines': 0}, {})[0][0].msg)"
    )
    proc = run_python("-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "no NVIDIA Xid in the kernel log (dmesg, 0 lines)"]


def test_listing_the_tasks_shows_the_lab_and_loads_no_run():
    seen = _modules_after(["fab", "--list"], "from fabfile import ns\nimport fleetops.cli")
    assert seen["lab"] and "lab.up" in seen["tasks"] and "patch" in seen["tasks"]
    # the executor imports the run only when a host task runs
    assert not seen["run"] and not seen["rich"]


def test_fab_list_lists_the_lab_tasks(tmp_path):
    proc = run_python("-m", "fabric", "--list")
    assert proc.returncode == 0, proc.stderr
    assert "lab.up" in proc.stdout and "patch" in proc.stdout and "history" in proc.stdout


def test_a_connection_writes_nothing_into_its_config(monkeypatch):
    import invoke.config

    from fleetops.plans.inventory import Host
    from fleetops.wire import ssh

    writes: list[tuple] = []
    original = invoke.config.Config._modify
    monkeypatch.setattr(
        invoke.config.Config,
        "_modify",
        lambda self, keypath, key, value: (
            writes.append((keypath, key)) or original(self, keypath, key, value)
        ),
    )
    host = Host(name="n1", address="127.0.0.1", port=2222, user="root", known_hosts=os.devnull)
    cxn = ssh._fabric_connection(host, None)
    assert writes == []
    assert cxn.fleetops_name == "n1" and "fleetops_name" not in cxn.config


def test_the_version_is_read_when_asked_for_not_at_start_up(tmp_path):

    import fleetops.cli

    assert fleetops.cli.program.version == "unknown"  # nothing read on import
    probe = run_python(
        "-c", "import fleetops.startup; print(fleetops.startup.versions()[0])", cwd=tmp_path
    )
    expected = probe.stdout.strip().removeprefix("fleetops ")  # the metadata that environment finds
    proc = run_python("-m", "fleetops.cli", "--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"fleetops {expected}" and "Fabric" in proc.stdout


def test_the_program_ends_without_pythons_teardown_keeping_its_output_and_exit_status():
    """Tearing down a finished run (every module cleared, the connections' objects collected) cost
    0.13-0.18 s of CPU and wall after the last line; fleet ends with os._exit once its streams are
    flushed. An atexit handler shows whether the teardown ran."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stdout.write('TEARDOWN\\n'))\n"
        "from fleetops.cli import main\n"
        "sys.argv = ['fleet'] + sys.argv[1:]\n"
        "main()\n"
    )

    def fab(*args: str) -> CompletedProcess:
        return run_python("-c", probe, *args)

    listed = fab("--list")
    assert listed.returncode == 0, listed.stderr
    assert "TEARDOWN" not in listed.stdout
    # flushed whole through the pipe
    assert "patch" in listed.stdout and listed.stdout.endswith("\n")
    wrong = fab("patch", "--chek")
    assert wrong.returncode == 2 and "'--chek' is not an option of patch" in wrong.stderr, wrong
    assert "TEARDOWN" not in wrong.stdout


PARSED_ALIKE = [
    ["fleet", "-H", "lab01", "patch", "verify", "--kinds", "grep,compile"],
    ["fleet", "-H", "lab01", "patch", "--check", "verify", "gpu", "extract"],
    ["fleet", "patch", "-H", "lab01", "--limit", "patch"],  # a task's name as an option's value
    ["fleet", "-H", "lab01", "pach"],  # a typo: the same error and suggestion
    ["fleet", "-H", "lab01", "patch", "--bogus"],
    ["fleet", "-H", "lab01", "verify", "--kinds"],  # an option without its value
    ["fleet", "--help", "patch"],
    ["fleet", "--help", "nosuchtask"],
    ["fleet", "-H", "lab01", "history", "patch"],
    ["fleet", "-H", "lab01", "--", "uname", "-a"],
    ["fleet", "-H", "lab01", "ping", "--", "patch"],
    ["fleet", "-H", "lab01", "playbook.lint"],
    ["fleet", "-H", "lab01", "lab.up", "--nodes", "2"],
    ["fleet", "init", "--force"],
    # completion lists every task: Invoke's full parser
    ["fleet", "--complete", "--", "fleet", "pa"],
]


def _parse(argv: list[str], capsys) -> object:
    """What Fleet's parse stages make of argv: per task its name and option values, the core
    options; or the usage error and what was printed."""
    from fabric import Config
    from invoke.exceptions import Exit, ParseError

    from fleetops.cli import Fleet
    from fleetops.fab.executor import FleetExecutor
    from fleetops.fab.tasks import fleet_namespace

    prog = Fleet(
        name="fleetops",
        namespace=fleet_namespace(),
        executor_class=FleetExecutor,
        config_class=Config,
        binary="fleet",
        binary_names=["fleet"],
    )
    try:
        prog.create_config()
        prog.parse_core(argv)
        prog.parse_collection()
        prog.parse_tasks()
        prog.parse_cleanup()
    except (Exit, ParseError, SystemExit) as exc:
        return (
            "exit",
            type(exc).__name__,
            str(getattr(exc, "message", exc)),
            getattr(exc, "code", None),
            capsys.readouterr(),
        )
    core = sorted((name, repr(arg.value)) for name, arg in prog.core[0].args.items())
    tasks = [
        (t.name, sorted((name, repr(arg.value)) for name, arg in t.args.items()))
        for t in prog.tasks
    ]
    return tasks, core, prog.core.remainder, capsys.readouterr()


@pytest.mark.parametrize("argv", PARSED_ALIKE, ids=" ".join)
def test_parsing_only_the_named_tasks_parses_the_command_line_alike(argv, monkeypatch, capsys):
    """Invoke built and deep-copied a parser context for every task on each run (~10 ms);
    Fleet builds them for the tasks the command line names. Same parse, same errors, same help."""
    from invoke.program import Program

    from fleetops.cli import Fleet

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", argv)
    built: list[str] = []
    original = Fleet._make_parser

    def counting(self):
        parser = original(self)
        built.extend(parser.contexts)
        return parser

    monkeypatch.setattr(Fleet, "_make_parser", counting)
    ours = _parse(argv, capsys)
    monkeypatch.setattr(Fleet, "_make_parser", Program._make_parser)
    invokes = _parse(argv, capsys)
    assert ours == invokes
    if "--complete" not in argv:
        assert len(built) <= 10, built  # not the whole collection (about 40 tasks)


def _probe_json(code: str) -> object:
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


OTHER_FAMILIES = (
    "fleetops.tasks.jobs",
    "fleetops.tasks.jobs.shards",
    "fleetops.tasks.jobs.slurm",
    "fleetops.tasks.diagnose",
    "fleetops.plans.rebase",
    "fleetops.plans.shards",
)
# The declared families (tasks/declare.py: node, gpu, patching, checks, adhoc, drain, oncall,
# authoring; each about a millisecond) are the task table itself, loaded with it; what their tasks
# run on (gpu's Slurm allocation: the jobs family) is not.


def test_a_run_imports_only_the_task_families_its_command_line_names():
    # The task table imported every family (jobs, Slurm, shards, diagnose, authoring, ...) and the
    # plans behind them for every run, ~20 ms that `patch verify` never uses.
    seen = _probe_json(
        "import sys, json, fleetops.cli, fleetops.run\n"
        f"others = {OTHER_FAMILIES!r}\n"
        "at_start = sorted(m for m in others if m in sys.modules)\n"
        "from fleetops.tasks.registry import TASKS\n"
        "names = [TASKS[n].name for n in ('patch', 'verify')]\n"
        "after_patch = sorted(m for m in others if m in sys.modules)\n"
        "extract = TASKS['extract']\n"
        "looked_up = sorted(m for m in others if m in sys.modules)\n"
        "print(json.dumps([at_start, names, after_patch, looked_up, extract.run.__module__]))"
    )
    # Looking a task up reads its declaration: the family it runs on loads when a host runs it.
    assert seen == [[], ["patch", "verify"], [], [], "fleetops.tasks.deferred"]


def test_every_task_of_every_family_is_in_the_task_table():
    """A task added to a family's TASKS (or a family added) without the family in
    registry.DECLARED_FAMILIES would be a task the fabfile does not offer and the run cannot
    find."""
    import importlib
    import pkgutil

    import fleetops.tasks
    from fleetops.tasks.registry import TASKS, declared_tasks

    declared = {}
    for info in pkgutil.iter_modules(fleetops.tasks.__path__):
        if info.name == "registry":
            continue
        specs = getattr(importlib.import_module(f"fleetops.tasks.{info.name}"), "TASKS", None)
        for spec in specs or ():
            declared[spec.name] = info.name
    assert declared == {
        name: task.plan.__module__.rsplit(".", 1)[1] for name, task in declared_tasks().items()
    }
    assert all(TASKS[name].name == name for name in TASKS)
    with pytest.raises(KeyError):
        TASKS["no-such-task"]
