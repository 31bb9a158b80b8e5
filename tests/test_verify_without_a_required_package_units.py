"""verify on a node that lacks a package the playbook requires altogether (a node without vLLM): the
checks that run the installed packages (import, callsites, probe) are not run and say why, instead
of failing on the absence in as many ways as they can; the file checks run. A package of another
version is no reason: those checks are what show the difference. No lab: remote_scripts' verify
in-process, under this Python."""

from __future__ import annotations

import importlib.metadata

import remote_scripts.checks.checks as checks
from fleetops.plans.versions import parse_pin
from remote_scripts.core.nodeio import forget_resolved

CHECKS = [
    {"kind": "import", "name": "imports", "module": "invoke.tasks", "attribute": "Task"},
    {"kind": "compile", "name": "compiles", "module": "invoke.tasks"},
    {
        "kind": "grep",
        "name": "greps",
        "module": "invoke.tasks",
        "pattern": r"^class Task\(",
        "expect": "match",
        "search": "code",
    },
]


def _verify(requires: list[str]) -> dict[str, dict]:
    forget_resolved()
    checks.forget_code_lines()
    pins = [parse_pin(r).to_request() for r in requires]  # as the client sends them
    answer = checks.verify({"state_dir": "", "requires": pins, "checks": CHECKS})
    return {i["name"]: i for i in answer["items"]}


def test_checks_that_run_packages_are_not_run_when_a_required_one_is_absent():
    items = _verify(["fleetops-no-such-package==1.0", "fleetops-nor-this>=2"])
    assert not items["requires"]["ok"]
    assert not items["imports"]["ok"] and items["imports"]["not_run"]
    assert items["imports"]["msg"].startswith(
        "not run: fleetops-no-such-package, fleetops-nor-this are not installed for "
    )
    assert (
        "(the playbook requires fleetops-no-such-package==1.0, fleetops-nor-this>=2)"
        in items["imports"]["msg"]
    )
    assert items["compiles"]["ok"] and items["greps"]["ok"]  # they read the file only


def test_a_required_package_of_another_version_does_not_stop_them():
    version = importlib.metadata.version("pytest")
    items = _verify([f"pytest!={version}"])
    assert not items["requires"]["ok"]
    assert items["imports"]["ok"] and "not_run" not in items["imports"]
