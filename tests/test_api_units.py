"""The Python API refuses what it cannot do before anything connects, with fleetops' own errors
(exported from fleetops.api and fleetops): an unknown task or option named with a "did you mean",
never a bare KeyError or a misspelled option silently dropped. Its option table is the fab tasks'
own; it ships py.typed."""

from __future__ import annotations

import inspect

import pytest
from conftest import REPO

import fleetops
from fleetops import api
from fleetops.fab import tasks as fab_tasks
from fleetops.fab.decorators import RUN_OPTIONS
from fleetops.tasks.registry import TASKS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def test_an_unknown_task_is_fleetops_own_error_with_did_you_mean(tmp_path):
    with pytest.raises(fleetops.UnknownTask) as caught:
        # tmp_path: no inventory, so nothing could connect
        api.run(tmp_path, "lab01", [("pnig", {})])
    assert not isinstance(caught.value, KeyError)
    assert isinstance(caught.value, fleetops.UsageError) and isinstance(
        caught.value, api.UsageError
    )
    assert "unknown task 'pnig'; did you mean 'ping'?" in str(caught.value), caught.value


def test_a_misspelled_option_is_refused_not_ignored(tmp_path):
    with pytest.raises(api.UnknownOption) as caught:
        api.run(tmp_path, "lab01", [("ping", {}), ("verify", {"kind": "grep"})])
    msg = str(caught.value)
    assert "verify takes no option 'kind'; did you mean 'kinds'?" in msg and "playbook" in msg, msg
    # the front end's, not the API's
    with pytest.raises(api.UnknownOption, match="ping takes no option 'json'"):
        api.run(tmp_path, "lab01", [("ping", {"json": True})])


@pytest.mark.parametrize("bad", [["ping"], [("ping",)], [("ping", "kinds=grep")], [(1, {})]])
def test_a_malformed_task_list_is_a_usage_error(tmp_path, bad):
    with pytest.raises(fleetops.UsageError, match=r"give \(task name, \{option: value\}\)"):
        api.run(tmp_path, "lab01", bad)


def test_errors_are_exported_from_fleetops_and_the_api_alike():
    from fleetops.plans.inventory import UnknownHost
    from fleetops.plans.yamlsrc import ConfigError
    from fleetops.tasks.plan import UsageError

    for name in fleetops.__all__:
        assert getattr(fleetops, name) is getattr(api, name), name
    assert (fleetops.ConfigError, fleetops.UnknownHost, fleetops.UsageError) == (
        ConfigError,
        UnknownHost,
        UsageError,
    )
    assert set(fleetops.__all__) <= set(api.__all__)
    with pytest.raises(AttributeError):
        fleetops.no_such_name  # noqa: B018  (the lazy loader must not answer for every name)


def test_the_option_table_is_the_fab_tasks_own():
    """An option added to a fab task (or a task added) and not to api.TASK_OPTIONS fails here."""
    assert set(api.TASK_OPTIONS) == set(TASKS)
    for name, accepted in api.TASK_OPTIONS.items():
        task = fab_tasks.ns[name]
        params = inspect.signature(task.body).parameters
        declared = {p for p in params if p not in ("c", "json") and p not in RUN_OPTIONS}
        assert accepted == declared, (
            f"api.TASK_OPTIONS[{name!r}] = {sorted(accepted)}; fab's: {sorted(declared)}"
        )


def test_py_typed_ships_as_package_data():
    assert (REPO / "fleetops" / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    assert "py.typed" in data["fleetops"]
