"""The flag scheme, without a lab: every task's short flags are the documented ones (SHORT_FLAGS),
the same letter means the same option everywhere, and every host task takes the run options (plain
`fab` has no other place for --serial, --forks, --limit, --inventory)."""

from __future__ import annotations

import importlib.util

from conftest import REPO

from fleetops.fab.decorators import RUN_OPTIONS, SHORT_FLAGS, fleet_task_name


def _collection():
    spec = importlib.util.spec_from_file_location(
        "fleetops_fabfile_under_test", REPO / "fabfile.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ns


def test_short_flags_are_the_documented_scheme_on_every_task():
    ns = _collection()
    seen: dict[str, str] = {}
    for name in ns.task_names:
        if name.startswith("lab."):
            continue  # the lab's own tasks (fleetops/lab/tasks.py) are not operator tasks on hosts
        task = ns[name]
        for arg in task.get_arguments():
            long_name = arg.name
            shorts = [n for n in arg.names if len(n) == 1]
            assert shorts == ([SHORT_FLAGS[long_name]] if long_name in SHORT_FLAGS else []), (
                name,
                arg.names,
            )
            for short in shorts:
                assert seen.setdefault(short, long_name) == long_name, f"-{short} means two options"
    assert seen.get("j") == "json" and "h" not in seen


def test_every_host_task_takes_the_run_options():
    ns = _collection()
    host_tasks = [
        ns[name] for name in ns.task_names if getattr(ns[name].body, "fleetops_task", None)
    ]
    assert {t.name for t in host_tasks} >= {
        "patch",
        "rollback",
        "verify",
        "ping",
        "run",
        "status",
        "tail",
    }
    for task in host_tasks:
        names = {arg.name for arg in task.get_arguments()}
        assert set(RUN_OPTIONS) <= names, task.name
        assert fleet_task_name(type("Call", (), {"task": task})()) == task.name
