"""A drift report points at the line that was edited: a hand edit inside a patched hunk is told
against the patched lines (the form the file is nearer to), whether the file is being patched or
rolled back. Pure (the node's hunk code in-process), on a diff parsed as the playbook's are."""

from __future__ import annotations

from fleetops.plans import unidiff
from remote_scripts.patch import hunks as diff_engine

PRISTINE = "cfg = Config(\n    size=1,\n    mem=2,\n)\n\nrest = 1\nmore = 2\n"
PATCHED = (
    "cfg = Config(\n    size=1,\n    mem=2,\n    # one\n    # two\n    # three\n    "
    "caching=False,\n)\n\nrest = 1\nmore = 2\n"
)
DIFF = (
    "--- a/gen.py\n+++ b/gen.py\n@@ -1,6 +1,10 @@\n cfg = Config(\n     size=1,\n     mem=2,\n"
    "+    # one\n+    # two\n+    # three\n+    caching=False,\n )\n \n rest = 1\n"
)


def hunks(reverse: bool = False) -> list[dict]:
    [file_diff] = unidiff.parse(DIFF, "gen.diff")
    out = [h.to_request(i) for i, h in enumerate(file_diff.hunks)]
    if reverse:  # rollback's view: the patched lines are the ones to find
        out = [
            {
                **h,
                "old": h["new"],
                "new": h["old"],
                "old_start": h.get("new_start") or h["old_start"],
                "new_start": h["old_start"],
            }
            for h in out
        ]
    return out


def test_the_parsed_hunk_takes_pristine_to_patched():
    lines = diff_engine.split_lines(PRISTINE)
    cls = diff_engine.classify(lines, hunks())
    assert cls["overall"] == "pristine"
    assert diff_engine.apply_hunks(lines, hunks(), cls) == PATCHED


def test_a_hand_edit_inside_a_patched_hunk_is_named_at_its_own_line():
    edited = PATCHED.replace("caching=False", "caching=True")
    assert edited.splitlines()[6] == "    caching=True,"  # line 7
    for reverse in (False, True):  # patch --check, and rollback --check
        lines = diff_engine.split_lines(edited)
        cls = diff_engine.classify(lines, hunks(reverse))
        assert cls["overall"] == "drifted", reverse
        [item] = diff_engine.drift_report(lines, hunks(reverse), cls)
        assert item["first_difference"] == {
            "line": 7,
            "expected": "    caching=False,",
            "found": "    caching=True,",
        }, (reverse, item)


def test_an_edit_of_the_pristine_lines_is_still_told_against_them():
    edited = PRISTINE.replace("    mem=2,\n", "    mem=3,\n")
    lines = diff_engine.split_lines(edited)
    cls = diff_engine.classify(lines, hunks())
    [item] = diff_engine.drift_report(lines, hunks(), cls)
    assert item["first_difference"] == {
        "line": 3,
        "expected": "    mem=2,",
        "found": "    mem=3,",
    }, item
