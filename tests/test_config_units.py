"""Pure parsers and planners: YAML with lines, inventory, playbooks, unified diffs, versions,
hunks."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from fleetops.plans import unidiff
from fleetops.plans.inventory import Inventory, UnknownHost, load_inventory
from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import ConfigError, load_text
from fleetops.results import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    Item,
    Result,
    Status,
    exit_status,
    rollup,
)
from remote_scripts.patch import hunks as diff_engine

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# ---------------------------------------------------------------- YAML
def test_malformed_yaml_reports_file_and_line():
    with pytest.raises(ConfigError) as err:
        load_text("a: 1\nb: [1, 2\nc: 3\n", "x.yaml")
    assert str(err.value).startswith("x.yaml:")
    assert err.value.line in (3, 4)


def test_duplicate_keys_are_errors_with_line():
    with pytest.raises(ConfigError, match=r"x.yaml:3:1: duplicate key 'a'"):
        load_text("a: 1\nb: 2\na: 3\n", "x.yaml")


TAGS = [
    "!!seq",
    "!!map",
    "!!set",
    "!!omap",
    "!!pairs",
    "!!str",
    "!!int",
    "!!float",
    "!!bool",
    "!!null",
    "!!binary",
    "!!timestamp",
    "!!merge",
    "!!value",
    "!!python/object",
    "!local",
]
SHAPES = ["x", "[1, 2]", "{a: 1}", "''", "[]", "{}"]


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("shape", SHAPES)
def test_an_explicit_tag_on_any_node_reads_or_gives_a_config_error(tag, shape):
    """Found by a helper: `q: !!seq x` escaped load_text as AttributeError ('str' object has no
    attribute 'tag'): a traceback for a typo in an inventory. Every tag on every shape either reads
    or names file:line."""
    try:
        load_text(f"a: 1\nq: {tag} {shape}\n", "x.yaml")
    except ConfigError as err:
        assert str(err).startswith("x.yaml:2"), err


def test_a_sequence_tag_on_a_scalar_names_the_tag_and_the_line():
    with pytest.raises(ConfigError, match=r"x.yaml:2:4: .*!!seq.*sequence"):
        load_text("a: 1\nq: !!seq x\n", "x.yaml")


def test_keys_written_beside_a_merge_override_the_merged_ones():
    """Found by a helper: `<<: *d` then the same key was refused as a duplicate. In YAML the
    mapping's own keys override merged ones (that is what `<<` is for: defaults, then the host's
    values); earlier merge sources win over later ones. A key written twice by hand is still a
    duplicate."""
    text = (
        "base: &d {user: ops, port: 22}\nmore: &m {port: 2222, python: /v/bin/python}\n"
        "one:\n  <<: *d\n  port: 2200\n"
        "two:\n  <<: [*m, *d]\n"
        "three:\n  port: 1\n  <<: *d\n"
    )
    data = load_text(text, "x.yaml")
    assert data["one"] == {"user": "ops", "port": 2200}
    assert data["one"].line_of("port") == 5
    assert data["two"] == {"user": "ops", "port": 2222, "python": "/v/bin/python"}
    # the own key wins wherever the merge is written
    assert data["three"] == {"user": "ops", "port": 1}
    with pytest.raises(ConfigError, match=r"x.yaml:2:24: duplicate key 'port'"):
        load_text("base: &d {port: 22}\none: {<<: *d, port: 1, port: 2}\n", "x.yaml")


# ---------------------------------------------------------------- inventory
def test_inventory_resolves_names_groups_and_plain_ssh_hosts(tmp_path):
    write(
        tmp_path,
        "fleet.yaml",
        "defaults:\n  user: ops\nhosts:\n  gpu01:\n    address: 10.0.0.1\n"
        "    python: /opt/venv/bin/python\n    groups: [gpus]\n"
        "  gpu02:\n    address: 10.0.0.2\n    groups: [gpus]\n",
    )
    inv = load_inventory(tmp_path)
    assert inv.resolve("gpu01").python == "/opt/venv/bin/python"
    assert inv.resolve("gpu02").user == "ops"
    assert [h.name for h in inv.expand(["@gpus", "gpu01"])] == ["gpu01", "gpu02"]
    plain = inv.resolve("admin@node7.example:2222")
    assert (plain.user, plain.address, plain.port) == ("admin", "node7.example", 2222)
    with pytest.raises(UnknownHost, match="unknown host 'gpu03'; known hosts: gpu01, gpu02"):
        inv.resolve("gpu03")
    with pytest.raises(UnknownHost, match="unknown group '@cpus'"):
        inv.expand(["@cpus"])


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("port", "99999", 4),
        ("user", "'root; rm -rf /'", 4),
        ("python", "'/x/python $(id)'", 4),
        ("python", "relative/python", 4),
        ("state_dir", "'/a/../etc'", 4),
        ("address", "'10.0.0.1 -oProxyCommand=x'", 4),
        ("colour", "blue", 4),
        ("groups", "['a b']", 4),
    ],
)
def test_inventory_schema_errors_name_file_and_line(tmp_path, key, value, line):
    path = write(
        tmp_path, "bad.yaml", f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    {key}: {value}\n"
    )
    if key == "address":
        path.write_text(f"hosts:\n  gpu01:\n    port: 22\n    address: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path)
    assert err.value.path == str(path) and err.value.line == line, str(err.value)


def test_example_inventory_is_documentation_and_never_connectable():
    inv = load_inventory(REPO / "hosts")
    gpu01 = inv.hosts["gpu01"]
    assert gpu01.address == "10.1.230.174" and gpu01.example and gpu01.gpus == 8
    from fleetops.wire.ssh import NodeConnection, TransportError

    with pytest.raises(TransportError, match="example inventory"):
        NodeConnection(gpu01).open()  # refused before any socket is made


# ---------------------------------------------------------------- playbooks and diffs
def test_shipped_playbook_loads():
    book = load_playbook(PLAYBOOK)
    assert book.requires[:2] == ["speculators==0.3.0", "vllm==0.16.*"]
    assert any(p.module.endswith("vllm_hidden_states_generator") for p in book.patches)
    assert len(book.sha256) == 64


@pytest.mark.parametrize(
    "body,line,fragment",
    [
        ("name: x\nbogus: 1\n", 2, "unknown key 'bogus'"),
        (
            "name: x\npatches:\n  - module: a.b\n    diff: missing.diff\n",
            4,
            "file not found: missing.diff",
        ),
        ("name: x\nverify:\n  - kind: grep\n    module: a.b\n    pattern: '[a-'\n", 5, "bad regex"),
        ("name: x\nverify:\n  - kind: teleport\n", 3, "unknown check kind 'teleport'"),
        ("name: x\nrequires: ['vllm=>0.16']\n", 2, "is not a list of PEP 440 version clauses"),
        (
            "name: x\npatches:\n  - module: 'os; rm -rf /'\n    diff: a.diff\n",
            3,
            "dotted module name",
        ),
    ],
)
def test_playbook_errors_name_file_and_line(tmp_path, body, line, fragment):
    path = write(tmp_path, "pb.yaml", body)
    with pytest.raises(ConfigError) as err:
        load_playbook(path)
    assert err.value.line == line and fragment in err.value.message, str(err.value)


def test_unidiff_parses_hunks_and_rejects_wrong_counts(tmp_path):
    text = (
        REPO / "playbooks/speculators-0.3.0-vllm-0.16/vllm_hidden_states_generator.diff"
    ).read_text()
    files = unidiff.parse(text, "gen.diff")
    assert len(files) == 1 and files[0].hunks
    assert all(h.old != h.new for h in files[0].hunks)
    with pytest.raises(ConfigError, match=r"bad.diff:3: hunk counts do not match"):
        unidiff.parse("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n", "bad.diff")
    with pytest.raises(ConfigError, match="no hunks"):
        unidiff.parse("just text\n", "empty.diff")


# ---------------------------------------------------------------- hunks on the node side
HUNKS = [
    {
        "index": 0,
        "header": "@@ -2,3 +2,3 @@",
        "old_start": 2,
        "old": ["b", "c", "d"],
        "new": ["b", "C", "d"],
    },
    {
        "index": 1,
        "header": "@@ -8,4 +8,5 @@",
        "old_start": 8,
        "old": ["h", "i", "j", "k"],
        "new": ["h", "i", "added", "j", "k"],
    },
]
PRISTINE = "".join(f"{x}\n" for x in "abcdefghijk")


def test_classify_apply_and_reverse_roundtrip():
    lines = diff_engine.split_lines(PRISTINE)
    cls = diff_engine.classify(lines, HUNKS)
    assert cls["overall"] == "pristine"
    patched = diff_engine.apply_hunks(lines, HUNKS, cls)
    assert patched == "a\nb\nC\nd\ne\nf\ng\nh\ni\nadded\nj\nk\n"
    pl = diff_engine.split_lines(patched)
    cls2 = diff_engine.classify(pl, HUNKS)
    assert cls2["overall"] == "patched"
    assert diff_engine.apply_hunks(pl, HUNKS, cls2, reverse=True) == PRISTINE


def test_offset_hunks_still_apply_and_partial_patch_is_drift():
    shifted = "zero\n" * 5 + PRISTINE
    lines = diff_engine.split_lines(shifted)
    assert diff_engine.classify(lines, HUNKS)["overall"] == "pristine"
    half = diff_engine.split_lines(PRISTINE.replace("c\n", "C\n"))
    cls = diff_engine.classify(half, HUNKS)
    assert cls["overall"] == "drifted"
    report = diff_engine.drift_report(half, HUNKS, cls)
    assert (
        report[0]["state"] == "partial"
        and "hunks [1] applied, hunks [2] not" in report[0]["message"]
    )


def test_drift_report_shows_first_difference():
    lines = diff_engine.split_lines(PRISTINE.replace("i\n", "I changed\n"))
    cls = diff_engine.classify(lines, HUNKS)
    report = diff_engine.drift_report(lines, HUNKS, cls)
    assert report[0]["hunk"] == 2
    assert report[0]["first_difference"] == {"line": 9, "expected": "i", "found": "I changed"}


# ---------------------------------------------------------------- results → exit status
def test_exit_status_is_decided_in_one_place():
    ok = Result("a", "patch", Status.OK, "")
    failed = Result("b", "patch", Status.FAILED, "", code=EXIT_FAILED)
    down = Result("c", "patch", Status.UNREACHABLE, "")
    assert exit_status([ok]) == 0
    assert exit_status([ok, failed]) == EXIT_FAILED
    assert exit_status([ok, failed, down]) == EXIT_UNREACHABLE
    assert rollup([Item("x", Status.OK, ""), Item("y", Status.CHANGED, "")]) is Status.CHANGED
    assert rollup([Item("x", Status.FAILED, ""), Item("y", Status.CHANGED, "")]) is Status.FAILED
    assert Inventory().names() == []
