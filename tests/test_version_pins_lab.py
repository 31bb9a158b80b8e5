"""A playbook's pins against a real lab node (vLLM 0.16.0, speculators 0.3.0 installed): the node
reports its versions and the client judges them by PEP 440 before anything is written. A pin the
node's version does not meet refuses the patch (and its check mode, and verify's requires item) with
the versions found; a pin whose versions the plan approved in advance patches in the same flight as
before; one that approves nothing in advance asks the node first, on the same connection, and the
verify sent ahead still goes once, behind the patch; a version outside what the plan approved is
reported back, judged, and the patch sent again."""

from __future__ import annotations

import time

import pytest
from conftest import GENERATOR, copy_playbooks, sha256

from fleetops import api
from fleetops.results import Status
from fleetops.wire.connector import COUNTERS

pytestmark = pytest.mark.lab
SHIPPED = "playbooks/speculators-0.3.0-vllm-0.16.yaml"


def playbook_with(lab, name: str, pins: list[str]) -> str:
    """The shipped playbook with other pins, beside it (its diffs are found the same way)."""
    copy_playbooks(lab.root)
    text = (lab.root / SHIPPED).read_text()
    head, rest = text.split("requires:\n", 1)
    rest = rest[rest.index("requires_hint:") :]
    path = lab.root / "playbooks" / f"{name}.yaml"
    path.write_text(head + "requires:\n" + "".join(f"  - {pin!r}\n" for pin in pins) + rest)
    return str(path)


def wire_events(host: str, since: float) -> list[tuple[str, str]]:
    return [
        (what, op)
        for at, name, what, op in list(COUNTERS.events)
        if name == host and at >= since and what != "closed"
    ]


def run(lab, book: str, *tasks: tuple[str, dict]) -> tuple[dict, list[tuple[str, str]]]:
    since = time.monotonic()
    results = api.run(
        lab.root, "lab01", [(name, {**kwargs, "playbook": book}) for name, kwargs in tasks]
    )
    return {r.task: r for r in results}, wire_events("lab01", since)


def test_a_pin_the_node_does_not_meet_refuses_the_patch_and_writes_nothing(lab):
    book = playbook_with(lab, "pins-rc", ["speculators==0.3.0", "vllm==0.16.0rc1"])
    target = lab.node("lab01").module_file(GENERATOR)
    before = sha256(target)
    got, _ = run(lab, book, ("patch", {}))
    patch = got["patch"]
    assert patch.status is Status.FAILED and sha256(target) == before, patch
    assert patch.items[0].msg.startswith(
        "requirements not met: need vllm==0.16.0rc1; found speculators 0.3.0, "
        "vllm 0.16.0. This playbook patches exactly"
    ), patch.items[0].msg
    got, _ = run(lab, book, ("patch", {"check": True}))
    assert (
        got["patch"].status is Status.FAILED and "need vllm==0.16.0rc1" in got["patch"].items[0].msg
    )
    got, _ = run(lab, book, ("verify", {"kinds": "compile"}))
    requires = next(i for i in got["verify"].items if i.label == "requires [requires]")
    assert (
        requires.status is Status.FAILED and requires.msg == "requirements not met: vllm==0.16.0rc1"
    )
    assert requires.details["evidence"] == [
        "speculators 0.3.0 (ok)",
        "vllm 0.16.0 (want vllm==0.16.0rc1)",
    ]
    assert sha256(target) == before


def test_the_shipped_pins_patch_in_the_same_flight_as_before(lab):
    got, events = run(lab, SHIPPED, ("patch", {}), ("verify", {"kinds": "grep,compile"}))
    assert got["patch"].status is Status.CHANGED and got["verify"].status is Status.OK, got
    assert events == [
        ("sent", "patch"),
        ("sent_ahead", "verify"),
        ("answered", "patch"),
        ("answered", "verify"),
    ]
    requires = next(i for i in got["verify"].items if i.label == "requires [requires]")
    assert requires.msg == "all requirements met"
    assert requires.details["evidence"] == ["speculators 0.3.0 (ok)", "vllm 0.16.0 (ok)"]


def test_a_pin_that_approves_nothing_in_advance_asks_the_node_first(lab):
    book = playbook_with(lab, "pins-bare", ["speculators==0.3.0", "vllm"])
    got, events = run(lab, book, ("patch", {}), ("verify", {"kinds": "grep,compile"}))
    assert got["patch"].status is Status.CHANGED and got["verify"].status is Status.OK, got
    assert events == [
        ("sent", "facts"),
        ("answered", "facts"),
        ("sent", "patch"),
        ("sent_ahead", "verify"),
        ("answered", "patch"),
        ("answered", "verify"),
    ], events


def test_a_version_outside_what_the_plan_approved_is_judged_and_the_patch_sent_again(lab):
    # approves 0.1.x and 0.2.x
    book = playbook_with(lab, "pins-wide", ["speculators==0.3.0", "vllm>=0.1"])
    got, events = run(lab, book, ("patch", {}), ("verify", {"kinds": "grep,compile"}))
    assert got["patch"].status is Status.CHANGED and got["verify"].status is Status.OK, got
    sent = [e for e in events if e[0] != "answered"]
    # The first patch wrote nothing (0.16.0 was not among what the plan approved); the verify that
    # went out behind it ran before the patch did, so it is asked again behind the second one.
    assert sent == [
        ("sent", "patch"),
        ("sent_ahead", "verify"),
        ("sent", "patch"),
        ("sent", "verify"),
    ], events
