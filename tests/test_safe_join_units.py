"""safe_join: the one way a local path is built from a node's words (fetch's local names, capture's
diff names, rebase's candidate name). Pure: no node, no lab."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetops.plans.localpath import MAX_NAME, UnsafeName, check_name, safe_join, safe_join_relative

BASE = Path("/home/op/playbooks")


@pytest.mark.parametrize(
    "name",
    [
        "..",
        ".",
        "",
        "../x",
        "a/b",
        "/etc",
        "/",
        "a\\b",
        "..\\x",
        "x\x00y",
        "x\ny",
        "\x1b[2J",
        "a\x7f",
        "x" * (MAX_NAME + 1),
        "é" * 128,
    ],
)
def test_a_name_that_is_not_one_plain_component_is_refused(name):
    with pytest.raises(UnsafeName):
        safe_join(BASE, name)


@pytest.mark.parametrize("name", [None, 3, b"x", ["a"]])
def test_a_name_that_is_not_text_is_refused(name):
    with pytest.raises(UnsafeName, match="not text"):
        safe_join(BASE, name)


@pytest.mark.parametrize(
    "names",
    [
        ("speculators-0.4.0.yaml",),
        ("fix", "vllm_hidden_states_generator.diff"),
        ("..x",),
        ("x..",),
        ("...",),
        (".hidden",),
        ("a b",),
        ("é" * 127,),
    ],
)
def test_plain_names_join_under_the_base(names):
    assert safe_join(BASE, *names) == BASE.joinpath(*names)


def test_the_node_chosen_names_that_once_escaped_are_refused():
    # what a hostile node answered to rebase (a version) and capture (module names)
    with pytest.raises(UnsafeName, match="separator"):
        safe_join(BASE, "speculators-../../../../../outside/PWNED-rebase.yaml")
    for module in (
        "../../../../../../../outside/CAPTURED",
        "y/../../../../../../../outside/CAPTURED",
    ):
        with pytest.raises(UnsafeName):
            safe_join(BASE, "fix", module + ".diff")


def test_no_names_is_refused():
    with pytest.raises(UnsafeName):
        safe_join(BASE)


@pytest.mark.parametrize(
    "rel",
    ["../x", "/etc/passwd", "a/../../b", "", "a//b", "./a", "a/.", "a/", "a/b\x00", "a\\..\\b"],
)
def test_a_relative_path_is_refused_for_any_bad_name_in_it(rel):
    with pytest.raises(UnsafeName):
        safe_join_relative(BASE, rel)


def test_a_relative_path_of_plain_names_joins():
    assert (
        safe_join_relative(BASE, "job-1/output/manifest.json")
        == BASE / "job-1" / "output" / "manifest.json"
    )
    assert safe_join_relative(PurePosixPath(), "a/b") == PurePosixPath("a/b")


def test_the_error_says_which_rule_and_what():
    with pytest.raises(UnsafeName, match=r"diff name '\.\.' is not a file name"):
        check_name("..", "diff name")
    with pytest.raises(UnsafeName, match="absolute"):
        safe_join_relative(BASE, "/etc/passwd", "local name")


@given(st.lists(st.text(min_size=0, max_size=40), min_size=1, max_size=4))
def test_whatever_the_names_the_result_is_inside_the_base_or_refused(names):
    try:
        joined = safe_join(BASE, *names)
    except UnsafeName:
        return
    assert BASE in joined.parents
    assert ".." not in joined.relative_to(BASE).parts and len(
        joined.relative_to(BASE).parts
    ) == len(names)


@given(st.text(alphabet=st.sampled_from("ab./\\\x00"), max_size=30))
def test_whatever_the_relative_path_the_result_is_inside_the_base_or_refused(rel):
    try:
        joined = safe_join_relative(BASE, rel)
    except UnsafeName:
        return
    inside = joined.relative_to(BASE).parts
    assert inside and ".." not in inside and "." not in inside and inside == tuple(rel.split("/"))
