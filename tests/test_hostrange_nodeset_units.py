"""-H and --limit host ranges read as ClusterShell's NodeSet reads them (the HPC tools' notation):
steps, several brackets in one word, digits beside a bracket, its padding rules, and every body
NodeSet refuses refused here too, with exit status 2 and one line, never read as a filename wildcard
that selects other hosts. NodeSet itself is the reference, on a generated corpus; fleetops does not
import it (ClusterShell is a dev dependency only).

Where fleetops differs from NodeSet on purpose, the test says so: a bracket of digits alone
(`gpu[12]`) is the fnmatch class fleetops always read (gpu1 or gpu2), and negative numbers
(NodeSet's `[-3-2]`) name no host."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ClusterShell.NodeSet import NodeSet
from conftest import REPO
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from fleetops.plans import hostrange
from fleetops.plans.inventory import Host, Inventory

FLEET = Path(sys.executable).parent / "fleet"


def reference(word: str, most: int = 100_000) -> list[str] | None:
    """NodeSet's names for `word`, or None where NodeSet refuses it (a parse error, or the
    ValueError it raises for `gpu1[-1]`); [] where it names more than `most` (counted without
    listing them)."""
    try:
        nodes = NodeSet(word)
        return list(nodes) if len(nodes) <= most else []
    except Exception:  # NodeSet's own errors differ by version; refusing is what is compared
        return None


def negative(word: str) -> bool:
    """Whether a bracket of `word` writes a negative number the way NodeSet reads one (`[-5]`,
    `[-3-2]`, `[1-2-3]`)."""
    for body in re.findall(r"\[([^\[\]]*)\]", word):
        for element in body.split(","):
            base = element.split("/", 1)[0].strip()
            if base.startswith("-") or base.count("-") > 1:
                return True
    return False


# ---------------------------------------------------------------- the cases the README's users met
@pytest.mark.parametrize(
    "word,names",
    [
        ("node[3-16/2]", ["node3", "node5", "node7", "node9", "node11", "node13", "node15"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("gpu[0-10/5]", ["gpu0", "gpu5", "gpu10"]),
        ("lab0[1-3]", ["lab01", "lab02", "lab03"]),
        ("n[1-2]0", ["n10", "n20"]),
        (
            "rack[1-2]-gpu[01-02].dc",
            ["rack1-gpu01.dc", "rack1-gpu02.dc", "rack2-gpu01.dc", "rack2-gpu02.dc"],
        ),
        ("root@lab[01-02]:2222", ["root@lab01:2222", "root@lab02:2222"]),
    ],
)
def test_steps_several_brackets_and_digits_beside_a_bracket_expand_as_nodeset_does(word, names):
    assert hostrange.is_range(word)
    assert sorted(hostrange.expand(word)) == sorted(names)
    assert sorted(NodeSet(word)) == sorted(names) or "@" in word  # NodeSet reads `@` as a group


@pytest.mark.parametrize(
    "word,why",
    [
        ("h[1,,2]", "empty"),
        ("gpu1[-1]", "negative"),
        ("lab[1-03]", "padding"),
        ("lab[001-10]", "padding"),
        ("lab0[1-10]", "padding"),
        ("n[3/2]", "step"),
        ("n[1-10/0]", "step"),
        ("n[5-3]", "downwards"),
        ("n[]", "empty"),
        ("n[1-2][3-4]", "bracket"),
        ("n[1-2]1[3-4]", "bracket"),
        ("n[1-3/2]0", "step"),
        ("n[1-2", "bracket"),
        ("n[[1-2]", "bracket"),
        ("r[1-2]n[a-b]", "number"),
        ("n[1--2]", "negative"),
        ("n[1-]", "number"),
    ],
)
def test_a_body_nodeset_refuses_is_refused_with_one_line_naming_the_word(word, why):
    assert reference(word) is None
    assert hostrange.is_range(word), "read as a glob, it would select other hosts"
    with pytest.raises(hostrange.RangeError) as err:
        hostrange.expand(word)
    message = str(err.value)
    assert "\n" not in message and repr(word) in message and why in message, message


def test_a_bracket_of_digits_alone_stays_fleetops_glob():
    assert not hostrange.is_range("gpu[12]") and hostrange.expand("gpu[12]") == ["gpu[12]"]
    assert NodeSet("gpu[12]") == NodeSet("gpu12")  # NodeSet's reading, which fleetops does not take


def inventory() -> Inventory:
    inv = Inventory(ssh_aliases=frozenset())
    for name in [*(f"node{i}" for i in range(1, 17)), "h1", "h2", "gpu1", "gpu11", "lab1", "lab3"]:
        inv.hosts[name] = Host(name, "127.0.0.1", 22, groups=("all",))
    return inv


def test_the_inventory_selects_what_nodeset_names_and_never_a_glob_of_a_bad_range():
    inv = inventory()
    assert [h.name for h in inv.expand(["node[3-16/2]"])] == [f"node{i}" for i in range(3, 17, 2)]
    assert [h.name for h in inv.limit(inv.expand(["node[1-16]"]), "node[1-16/5]")] == [
        "node1",
        "node6",
        "node11",
        "node16",
    ]
    for word in ("h[1,,2]", "gpu1[-1]", "lab[1-03]"):
        with pytest.raises(hostrange.RangeError):
            inv.expand([word])
        with pytest.raises(hostrange.RangeError):
            inv.limit(inv.expand(["@all"]), word)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "args",
    [
        ["-H", "h[1,,2]", "ping"],
        ["-H", "gpu1[-1]", "ping"],
        ["-H", "lab[1-03]", "ping"],
        ["-H", "@all", "ping", "--limit", "h[1,,2]"],
    ],
)
def test_fleet_refuses_a_bad_range_with_exit_2_and_one_line(tmp_path, args):
    (tmp_path / "hosts").mkdir()
    (tmp_path / "fabfile.py").write_text("from fleetops.fab.tasks import *  # noqa: F403\n")
    # nothing listens: a range read as a glob would end in "connection refused", not exit 2
    port = closed_port()
    hosts = "".join(
        f"  {name}:\n    address: 127.0.0.1\n    port: {port}\n    groups: [all]\n"
        for name in ("h1", "h2", "gpu1", "lab1", "lab3")
    )
    (tmp_path / "hosts" / "local.yaml").write_text(f"hosts:\n{hosts}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "FLEETOPS_NO_LIVE": "1"}
    proc = subprocess.run(
        [str(FLEET), *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "host range" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "refused" not in proc.stdout


# ---------------------------------------------------------------- the corpus: NodeSet is the
# reference
NUMBER = st.one_of(
    st.text("0123456789", min_size=1, max_size=2), st.text("0123456789", min_size=3, max_size=3)
)


@st.composite
def well_formed(draw) -> str:
    """`lo-hi`, `lo-hi/step` or `n`, low below high, both of one width: what a user means to
    write."""
    low = draw(st.integers(0, 40))
    high = low + draw(st.integers(0, 30))
    width = draw(st.sampled_from([0, 0, 2, 3]))
    text = f"{low:0{width}d}-{high:0{width}d}"
    return draw(st.sampled_from([text, f"{text}/{draw(st.integers(1, 4))}", f"{low:0{width}d}"]))


ELEMENT = st.one_of(
    *[well_formed()] * 8,
    NUMBER,
    st.builds("{}-{}".format, NUMBER, NUMBER),
    st.builds("{}-{}/{}".format, NUMBER, NUMBER, st.sampled_from(["0", "1", "2", "3", "02", "10"])),
    st.builds("{}/{}".format, NUMBER, st.sampled_from(["1", "2"])),
    st.sampled_from(["", "-1", "1-", "-", "1--2", "1-2-3", "a-b", "/2"]),
)
BODY = st.one_of(
    *[st.lists(ELEMENT, min_size=1, max_size=3).map(",".join)] * 3,
    st.text("0123456789-,/", max_size=8),
)
TEXT = st.one_of(
    *[st.sampled_from(["n", ".dc", "-gpu", "x"])] * 3, st.text("abn.-0123456789", max_size=4)
)
LEAD = st.sampled_from(["", "gpu", "n", "r", "node-", "gpu0", "lab1", "x-"])
GARBLE = st.sampled_from(["", "", "", "", "", "", "", "[", "]", "[]"])


@st.composite
def words(draw) -> str:
    brackets = draw(st.sampled_from([1, 1, 2, 2, 3]))
    word = draw(LEAD)
    for _ in range(brackets):
        word += f"[{draw(BODY)}]{draw(TEXT)}"
    at = draw(st.integers(0, len(word)))
    return word[:at] + draw(GARBLE) + word[at:]


EXAMPLES = [
    "node[3-16/2]",
    "r[1-2]n[1-2]",
    "h[1,,2]",
    "gpu1[-1]",
    "x[1-03]",
    "n1[8-10]",
    "n[08-10]5",
    "n0[1-5/2]",
    "n[01,1]",
    "a1[1-2]b2[3-4]",
    "n[1,]0",
    "n[008-010,10]",
    "n9[8-10,11]",
    "n[1-2]x5",
    "n[]",
]


def with_examples(test):
    for word in EXAMPLES:
        test = example(word)(test)
    return test


@with_examples
@settings(deadline=None)  # a word of thousands of numbers, on a loaded machine
@given(words())
def test_fleetops_reads_every_range_as_nodeset_does(word):
    if not hostrange.is_range(word):
        # Read as a name or glob: only where no bracket holds range notation (a `-`, `,` or `/`, or
        # nothing).
        assert all(
            re.fullmatch(r"[0-9]+", body) or not re.fullmatch(r"[0-9,/-]*", body)
            for body in re.findall(r"\[([^\[\]]*)\]", word)
        ), word
        return
    expected = reference(word, most=2_000)
    # thousands of names: the corpus compares readings, not sizes (test_fold_units does)
    assume(expected != [])
    try:
        got = hostrange.expand(word)
    except hostrange.RangeError as exc:
        # no host has a negative number
        assert expected is None or negative(word), (word, expected, str(exc))
        return
    assert expected is not None, (word, got)
    assert len(got) == len(set(got)) and sorted(got) == sorted(expected), (word, got, expected)
