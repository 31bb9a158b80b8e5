"""A playbook's version pins are judged on the client by PEP 440 (`packaging`): a release pin
refuses a pre-release or nightly of that release, `!=` refuses only the version it names, local
versions and `~=`, `===`, wildcards and epochs read as PEP 440 says; a playbook opts into
pre-releases with `allow_prereleases: true`; a malformed pin is a ConfigError at its
file:line:column."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from fleetops.plans import versions
from fleetops.plans.lint import lint as lint_playbook
from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import ConfigError

# (installed version, pin, allow_prereleases, satisfied)
TABLE = [
    # a release pin never takes a pre-release or a nightly of that release; != refuses only what it
    # names
    ("0.16.0rc1", "vllm==0.16.0", False, False),
    ("0.16.0.dev20260101", "vllm==0.16.0", False, False),
    ("0.16.0rc1", "vllm>=0.16.0", False, False),
    ("0.16.0.dev20260101", "vllm>=0.16.0", False, False),
    ("0.16.0.post1", "vllm!=0.16.0", False, True),
    # releases, zero padding, post releases
    ("0.16.0", "vllm==0.16.0", False, True),
    ("0.16", "vllm==0.16.0", False, True),
    ("0.16.0.post1", "vllm==0.16.0", False, False),
    ("0.16.0.post1", "vllm>=0.16.0", False, True),
    ("0.16.0.post1", "vllm==0.16.*", False, True),
    ("0.16.2", "vllm==0.16.*", False, True),
    ("0.11.0", "vllm==0.16.*", False, False),
    ("0.16.0", "vllm!=0.16.*", False, False),
    ("0.17.0", "vllm!=0.16.*", False, True),
    # local versions (+cu128): ignored by a pin without one, compared by a pin with one
    ("0.16.0+cu128", "vllm==0.16.0", False, True),
    ("0.16.0+cu128", "vllm==0.16.0+cu128", False, True),
    ("0.16.0+cu126", "vllm==0.16.0+cu128", False, False),
    ("0.16.0", "vllm==0.16.0+cu128", False, False),
    ("0.16.0+cu128", "vllm>=0.16,<0.17", False, True),
    ("0.17.0", "vllm>=0.16,<0.17", False, False),
    # ~= (compatible release) and === (the very string)
    ("2.9.1", "torch~=2.9.0", False, True),
    ("2.10.0", "torch~=2.9.0", False, False),
    ("2.10.0", "torch~=2.9", False, True),
    ("3.0", "torch~=2.9", False, False),
    ("0.16.0", "vllm===0.16.0", False, True),
    ("0.16", "vllm===0.16.0", False, False),
    ("0.16.0+cu128", "vllm===0.16.0", False, False),
    # pre-releases: when the pin names one, or the playbook allows them
    ("0.16.0rc1", "vllm==0.16.0rc1", False, True),
    ("0.16.0rc2", "vllm>=0.16.0rc1", False, True),
    ("0.16.0", "vllm>=0.16.0rc1", False, True),
    ("0.16.1rc1", "vllm==0.16.*", False, False),
    ("0.16.1rc1", "vllm==0.16.*", True, True),
    ("0.17.0.dev20260101", "vllm>=0.16.0", True, True),
    # allowed or not, an rc is not the release it precedes
    ("0.16.0rc1", "vllm==0.16.0", True, False),
    ("0.17.0rc1", "vllm<0.17", True, False),  # nor below it
    ("0.17.0rc1", "vllm", False, False),
    ("0.17.0rc1", "vllm", True, True),
    ("0.16.0", "vllm", False, True),
    # epochs
    ("1!0.1", "vllm>=2.0", False, True),
]


def _pin(text: str) -> versions.Pin:
    return versions.parse_pin(text)


@pytest.mark.parametrize(("found", "pin", "allow", "ok"), TABLE, ids=lambda v: str(v))
def test_pins_are_judged_as_packaging_judges_them(found, pin, allow, ok):
    assert versions.verdict(_pin(pin), found, allow)[0] is ok
    # the reference, with PEP 440's rule for pre-releases spelt out
    specifier = Requirement(pin).specifier
    named = any(spec.prereleases for spec in specifier)
    assert specifier.contains(Version(found), prereleases=allow or named) is ok


def test_a_refused_pre_release_says_how_to_accept_it():
    ok, why = versions.verdict(_pin("vllm>=0.16.0"), "0.17.0.dev20260101", False)
    assert (
        not ok
        and why
        == "0.17.0.dev20260101 is a development release: the playbook accepts one with "
        "allow_prereleases: true"
    )
    ok, why = versions.verdict(_pin("vllm==0.16.*"), "0.16.1rc1", False)
    assert not ok and "is a pre-release" in why
    # allowing would not help
    assert versions.verdict(_pin("vllm==0.16.0"), "0.16.0rc1", False) == (False, "")


def test_missing_and_non_pep440_versions():
    assert versions.verdict(_pin("vllm==0.16.0"), None, False) == (False, "not installed")
    assert versions.verdict(_pin("vllm==0.16.0"), "custom-build", False) == (
        False,
        "custom-build is not a PEP 440 version",
    )
    assert versions.verdict(_pin("vllm===custom-build"), "custom-build", False) == (True, "")


def test_the_versions_a_patch_may_go_ahead_on_are_judged_in_advance():
    assert versions.approvable(_pin("speculators==0.3.0"), False) == ["0.3.0"]
    assert versions.approvable(_pin("vllm==0.16.0rc1"), False) == ["0.16.0rc1"]
    assert versions.approvable(_pin("vllm===0.16.0"), False) == ["0.16.0"]
    wildcard = versions.approvable(_pin("vllm==0.16.*"), False)
    assert (
        wildcard[:3] == ["0.16", "0.16.0", "0.16.1"]
        and wildcard[-1] == "0.16.20"
        and len(wildcard) == 22
    )
    assert "0.16.0" in versions.approvable(_pin("vllm>=0.16,<0.17"), False)
    assert versions.approvable(_pin("vllm!=0.16.0"), False)[:2] == ["0.16.1", "0.16.2"]
    # nothing named: the installed version is asked for
    assert versions.approvable(_pin("vllm"), False) == []
    # each one judged by packaging
    for pin in ("vllm==0.16.*", "vllm>=0.16", "torch~=2.9.0", "vllm!=0.16.*"):
        assert all(
            versions.verdict(_pin(pin), v, False)[0] for v in versions.approvable(_pin(pin), False)
        ), pin


def test_a_node_report_is_judged_into_a_verify_item_and_a_patch_refusal():
    reported = [
        {"requirement": "vllm>=0.16.0", "package": "vllm", "found": "0.17.0rc1"},
        {"requirement": "speculators==0.3.0", "package": "speculators", "found": "0.3.0"},
    ]
    item = {
        "name": "requires",
        "kind": "requires",
        "ok": False,
        "msg": "installed versions reported; the client judges them",
        "evidence": [],
        "requirements": reported,
    }
    answer = versions.judged_checks(
        {"ok": False, "items": [item, {"kind": "grep", "ok": True}]}, False
    )
    assert (
        answer["ok"] is False
        and item["ok"] is False
        and item["msg"] == "requirements not met: vllm>=0.16.0"
    )
    assert item["evidence"] == [
        "vllm 0.17.0rc1 (want vllm>=0.16.0; 0.17.0rc1 is a pre-release: the playbook "
        "accepts one with allow_prereleases: true)",
        "speculators 0.3.0 (ok)",
    ]
    item.update(requirements=reported)
    answer = versions.judged_checks({"ok": False, "items": [item]}, True)
    assert answer["ok"] is True and item["msg"] == "all requirements met"
    refused = versions.judged_patch(
        {"ok": True, "items": [{"status": "would_apply"}], "requirements": reported},
        False,
        "Use the 0.17 playbook.",
    )
    (only,) = refused["items"]
    assert only["status"] == "refused" and refused["ok"] is False
    assert only["msg"] == (
        "requirements not met: need vllm>=0.16.0 (0.17.0rc1 is a pre-release: the playbook "
        "accepts one with allow_prereleases: true); found vllm 0.17.0rc1, speculators 0.3.0. "
        "Use the 0.17 playbook."
    )
    kept = versions.judged_patch(
        {"ok": True, "items": [{"status": "would_apply"}], "requirements": reported}, True
    )
    assert kept["items"] == [{"status": "would_apply"}]


def test_an_item_nobody_judged_stays_failed():
    # The node sets ok false on its report: a client path that forgot to judge it can never show a
    # pass.
    from remote_scripts.checks import checks

    item = checks.run_requires(
        {
            "kind": "requires",
            "name": "requires",
            "requires": [{"requirement": "pytest>=1", "package": "pytest"}],
        }
    )
    assert item["ok"] is False and item["requirements"][0]["found"]


# ---------------------------------------------------------------- playbooks
PLAYBOOK = (
    "name: pins\nrequires:\n  - speculators==0.3.0\n  - "
    "{pin}\nverify:\n  - kind: compile\n    module: json\n"
)


@pytest.mark.parametrize(
    "pin",
    [
        "vllm==0.16.x",
        "vllm=>0.16",
        "vllm==",
        "vllm[cuda]==0.16.0",
        "vllm==0.16.0; python_version > '3'",
        "vllm @ https://example.invalid/v.whl",
        "vllm 0.16.0",
    ],
)
def test_a_malformed_pin_is_a_config_error_at_its_line(tmp_path: Path, pin: str):
    path = tmp_path / "pins.yaml"
    path.write_text(PLAYBOOK.format(pin=f'"{pin}"'))
    with pytest.raises(ConfigError) as err:
        load_playbook(path)
    assert str(err.value).startswith(f"{path}:4:5: requirement {pin!r}"), str(err.value)
    problems = lint_playbook(path)
    assert [(p.line, p.kind) for p in problems] == [(4, "requires")], problems


def test_allow_prereleases_is_a_boolean_of_the_playbook(tmp_path: Path):
    path = tmp_path / "pins.yaml"
    path.write_text(PLAYBOOK.format(pin="vllm>=0.16") + "allow_prereleases: true\n")
    book = load_playbook(path)
    assert book.allow_prereleases is True and [p.package for p in book.pins] == [
        "speculators",
        "vllm",
    ]
    approved = book.patch_request()["versions_approved"]
    assert approved["speculators"] == ["0.3.0"] and approved["vllm"][:2] == ["0.16", "0.16.0"]
    assert book.verify_request()["requires"] == [
        {"requirement": "speculators==0.3.0", "package": "speculators"},
        {"requirement": "vllm>=0.16", "package": "vllm"},
    ]
    path.write_text(PLAYBOOK.format(pin="vllm>=0.16") + "allow_prereleases: yes\n")
    with pytest.raises(
        ConfigError,
        match=r"pins.yaml:8:1: 'allow_prereleases' must be true or false, got 'yes' "
        r"\(yes/no/on/off are text in YAML 1.2\)",
    ):
        load_playbook(path)
    assert [(p.line, p.kind) for p in lint_playbook(path)] == [(8, "schema")]
    path.write_text(PLAYBOOK.format(pin="vllm>=0.16"))
    assert load_playbook(path).allow_prereleases is False


def test_the_shipped_playbook_pins_read_as_before():
    book = load_playbook(
        Path(__file__).resolve().parent.parent / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
    )
    assert [(p.package, str(p.specifier)) for p in book.pins] == [
        ("speculators", "==0.3.0"),
        ("vllm", "==0.16.*"),
    ]
    assert versions.verdict(book.pins[1], "0.16.0", book.allow_prereleases) == (True, "")
    assert versions.verdict(book.pins[1], "0.16.1rc1", book.allow_prereleases)[0] is False


def _cells(drawn: str, fact: str) -> list[str]:
    """The cells of one fact's row of a drawn facts table, each put back together from the lines it
    folds onto."""
    rows: list[list[str]] = []
    for line in drawn.splitlines():
        if not line.startswith("│"):
            continue
        parts = [p.strip() for p in line.strip("│").split("│")]
        if parts[0]:
            rows.append(parts)
        elif rows:
            rows[-1] = [a + b for a, b in zip(rows[-1], parts, strict=True)]
    return next(r[1:] for r in rows if r[0] == fact)


def test_facts_show_a_nightlys_whole_version_however_narrow_the_terminal():
    import io

    from rich.console import Console

    from fleetops.plans.tables import fact_row
    from fleetops.report.console import render_table
    from fleetops.report.rows import fleet_sections
    from fleetops.results import Result, Status
    from fleetops.results.gpu import Facts

    nightly = "0.17.0rc2.dev155+g7a1b2c3d.cu128"
    facts = {
        "os": "Ubuntu 22.04.4 LTS",
        "python": "3.12.3",
        "driver": "570.124.06",
        "cuda": "12.8",
        "packages": {
            "vllm": nightly,
            "speculators": "0.3.0",
            "torch": "2.9.0+cu128",
            "transformers": "4.57.1",
        },
        "gpu_count": 8,
        "gpu_names": ["NVIDIA H200"],
        "disk_free_gib": {"venv": 812.4, "state_dir": 812.4},
    }
    results = [
        Result(f"gpu0{i}", "facts", Status.OK, "", payload=Facts(facts, fact_row(facts)))
        for i in range(1, 6)
    ]
    for width in (80, 120):
        out = io.StringIO()
        Console(file=out, width=width).print(render_table(fleet_sections(results)[0]))
        drawn = out.getvalue()
        if "│" in drawn:  # a table: each host's cell, put back together, is the whole version
            assert _cells(drawn, "vllm") == [nightly] * 5, drawn
        # too wide for a table at this width: a block per fact, `host: value` pairs, never cut
        else:
            assert [
                ln.count(nightly) for ln in drawn.splitlines() if nightly in ln
            ] and drawn.count(nightly) == 5, drawn


def test_an_identity_clause_holds_only_beside_every_other_clause():
    assert versions.verdict(_pin("vllm>=0.16,===abc"), "abc", False) == (
        False,
        "abc is not a PEP 440 version",
    )
    assert "abc" not in versions.approvable(_pin("vllm>=0.16,===abc"), False)
    assert versions.approvable(_pin("vllm>=0.16,===abc"), False) == []
    assert versions.verdict(_pin("vllm<0.17,===0.16.0"), "0.16.0", False) == (True, "")
    assert versions.verdict(_pin("vllm>=0.17,===0.16.0"), "0.16.0", False)[0] is False
    # the very string, case aside
    assert versions.verdict(_pin("vllm===ABC"), "abc", False) == (True, "")


def _corpus() -> list[tuple[str, str, bool]]:
    """Pins of one to three clauses over every operator, each against versions the clauses name and
    their neighbours (strings PEP 440 cannot read, pre-releases, locals, a leading v, epochs)."""
    import random

    rng = random.Random(440)
    pool = [
        "0.16",
        "0.16.0",
        "0.16.1",
        "0.17.0",
        "0.17.0rc1",
        "0.16.0.dev1",
        "0.16.0+cu128",
        "1!0.1",
        "abc",
        "ABC",
        "v0.16.0",
        "0.16.0.post1",
        "custom-build",
        "2.9",
    ]
    ops = ["==", "!=", ">=", "<=", ">", "<", "~=", "==="]
    out = []
    while len(out) < 3000:
        clauses = []
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(ops)
            version = rng.choice(pool + (["0.16.*"] if op in ("==", "!=") else []))
            clauses.append(f"{op}{version}")
        text = "vllm" + ",".join(clauses)
        try:
            versions.parse_pin(text)
        except ValueError:
            continue  # `~=0.16` needs two parts, `>=abc` is no version: packaging refuses those too
        out.append((text, rng.choice(pool), rng.random() < 0.3))
    return out


def test_pins_with_every_operator_are_judged_as_packaging_judges_version_strings():
    from packaging.specifiers import SpecifierSet

    wrong = []
    for text, found, allow in _corpus():
        pin = _pin(text)
        named = any(spec.prereleases for spec in pin.specifier)
        want = SpecifierSet(str(pin.specifier)).contains(found, prereleases=allow or named)
        if versions.verdict(pin, found, allow)[0] is not want:
            wrong.append((text, found, allow, want))
    assert wrong == []


def test_a_nodes_report_of_its_pins_is_read_with_bounded_work():
    # 120 KB: ~0.2 s of packaging's parsing, were it read
    long = "vllm" + ",".join([">=0.1"] * 20000)
    rows = versions.judge(
        [
            {"requirement": long, "package": "vllm", "found": "0.2"},
            {"requirement": "[[[", "package": "x", "found": "1"},
            {"requirement": "vllm==0.16.0", "package": "vllm", "found": "0.16.0"},
        ]
        + [{"requirement": "vllm==0.16.0", "package": "vllm", "found": "0.16.0"}] * 70,
        False,
    )
    assert [r["ok"] for r in rows[:3]] == [False, False, True]
    assert (
        rows[0]["why"] == "not read: over 1024 characters" and len(rows[0]["requirement"]) == 1024
    )
    assert rows[1]["why"].startswith("not read:")
    assert all(r["ok"] for r in rows[3:64]) and not any(r["ok"] for r in rows[64:])
    assert rows[-1]["why"] == "not read: the node reported over 64 pins"
