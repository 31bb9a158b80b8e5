"""Each declared host task (fleetops/tasks/declare.py) is the one statement of its name, help,
options, whether it writes and its agent op: the fab task, the API's options and --dry are read from
it, and what it says of itself holds (a task that writes nothing calls an op the agent counts as
read-only)."""

from __future__ import annotations

import inspect

import pytest

from fleetops import api
from fleetops.fab.decorators import RUN_OPTIONS, from_declaration, numbers_of
from fleetops.fab.tasks import ns
from fleetops.tasks.declare import JSON, HostTask, Option
from fleetops.tasks.plan import Plan
from fleetops.tasks.registry import TASKS, declared_tasks
from remote_scripts.core.protocol import READ_ONLY_OPS
from remote_scripts.ops import find_op


def _plan(run: object, kwargs: dict) -> Plan:
    return Plan("ping", {}, 60, None)


def test_the_fab_task_is_read_from_the_declaration():
    assert declared_tasks(), "no declared task"
    for name, task in declared_tasks().items():
        fab = ns[name]
        params = inspect.signature(fab.body).parameters
        own = {p: params[p].default for p in params if p != "c" and p not in RUN_OPTIONS}
        assert own == {
            o.name: (inspect.Parameter.empty if o.required else o.default) for o in task.options
        }
        # Invoke pops each option's help as its parser takes it: a task built afresh from the
        # declaration, not the namespace's one that an earlier test's parse may have emptied
        assert from_declaration(task).help == {
            **{k: text for k, (_, text) in RUN_OPTIONS.items()},
            **{o.name: o.help for o in task.options},
        }
        assert inspect.getdoc(fab.body) == task.help
        assert {k: v for k, v in numbers_of(fab).items() if k in own} == {
            o.name: o.numbers for o in task.options if o.numbers is not None
        }
        assert api.TASK_OPTIONS[name] == task.option_names()
        assert TASKS[name] is task


def test_a_task_that_writes_nothing_calls_a_read_only_op():
    for name, task in declared_tasks().items():
        if task.op and task.op != "ping":  # ping is the agent's own (core/agent.py)
            assert find_op(task.op) is not None, (
                f"{name} declares op {task.op!r}, which the node agent has not"
            )
        if not task.writes:
            assert task.op in READ_ONLY_OPS, (
                f"{name} writes nothing but its op {task.op!r} is not read-only"
            )


def test_dry_follows_from_writes_and_a_check_option():
    assert HostTask("a", _plan, op="ping").dry == "read-only"
    assert (
        HostTask("b", _plan, writes=True, options=(Option("check", "x", False), JSON)).dry
        == "check"
    )
    assert HostTask("c", _plan, writes=True).dry is None


def test_an_option_declared_twice_is_refused():
    with pytest.raises(ValueError, match="declared twice"):
        HostTask("d", _plan, options=(JSON, JSON))


def test_the_jobs_and_diagnose_are_declared_like_every_task():
    """The job tasks and diagnose are one declaration each, from which the fab task, the API's
    options and the task table are read; their options are the ones `fab TASK --help` lists."""
    from fleetops.results.diagnose import Diagnosis
    from fleetops.results.jobs import JobList, JobLogs, JobStatus, Launched, Stopped, TailEnded

    expected = {
        "diagnose": {"playbook"},
        "extract": {"force", "job", "playbook", "shards", "again"},
        "tail": {"job_id", "job", "playbook", "lines", "from_start"},
        "status": {"job_id", "job", "playbook"},
        "logs": {"lines", "job_id", "job", "playbook"},
        "stop": {"grace", "job_id"},
        "jobs": {"last"},
    }
    results = {
        "diagnose": Diagnosis,
        "extract": Launched,
        "tail": TailEnded,
        "status": JobStatus,
        "logs": JobLogs,
        "stop": Stopped,
        "jobs": JobList,
    }
    declared = declared_tasks()
    for name, options in expected.items():
        task = declared[name]
        assert (
            isinstance(task, HostTask) and task.option_names() == options == api.TASK_OPTIONS[name]
        ), name
        assert task.result is results[name], name
        assert ns[name].body.__module__ == "fleetops.tasks.deferred"
    assert {name for name, task in declared.items() if task.writes and task.dry is None} >= {
        "extract",
        "stop",
    }
    # --shards [N]
    assert [o.optional for o in declared["extract"].options if o.name == "shards"] == [True]
