"""Rebase, the pure part (fleetops/plans/rebase.py): the shipped hunks tried against changed
pristine files, judged against GNU patch (an independent implementation) on the real speculators
0.3.0 sources of the base venv: clean, offset, fuzz (with the differing context shown), conflict
(with the upstream text), already upstream; and the candidate diffs made afresh apply with `patch
-F0`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from fleetops.plans import unidiff
from fleetops.plans.playbook import load_playbook
from fleetops.plans.rebase import CLEAN, CONFLICT, FUZZ, OFFSET, UPSTREAM, rebase_file, unified_diff

pytestmark = pytest.mark.base_venv
BOOK = load_playbook(REPO / "playbooks/speculators-0.3.0-vllm-0.16.yaml")


def gnu_patch(tmp: Path, text: str, diff: Path | str, fuzz: int = 0) -> str | None:
    src, out = tmp / "src.py", tmp / "out.py"
    src.write_text(text)
    if isinstance(diff, str):
        (tmp / "d.diff").write_text(diff)
        diff = tmp / "d.diff"
    proc = subprocess.run(
        ["patch", f"-F{fuzz}", "-s", "-o", str(out), str(src), str(diff)],
        capture_output=True,
        text=True,
    )
    return out.read_text() if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def sources(lab_base):
    site = next(Path(lab_base).glob("lib/python3*/site-packages"))
    return {
        p.module: (site / (p.module.replace(".", "/") + ".py")).read_text() for p in BOOK.patches
    }


@pytest.mark.parametrize("patch", BOOK.patches, ids=lambda p: p.diff_path.name)
def test_the_pristine_file_rebases_clean_and_equals_gnu_patch(patch, sources, tmp_path):
    out = rebase_file(sources[patch.module], patch.hunks)
    assert [h.state for h in out.hunks] == [CLEAN] * len(patch.hunks)
    assert out.text == gnu_patch(tmp_path, sources[patch.module], patch.diff_path)


@pytest.mark.parametrize("patch", BOOK.patches, ids=lambda p: p.diff_path.name)
def test_lines_added_above_give_offset_and_the_fresh_diff_applies_at_fuzz_0(
    patch, sources, tmp_path
):
    shifted = "".join(f"# added upstream {i}\n" for i in range(9)) + sources[patch.module]
    out = rebase_file(shifted, patch.hunks)
    assert [(h.state, h.offset) for h in out.hunks] == [(OFFSET, 9)] * len(patch.hunks)
    assert out.text == gnu_patch(tmp_path, shifted, patch.diff_path)
    rel = patch.module.replace(".", "/") + ".py"
    fresh = unified_diff(shifted, out.text, rel)
    assert [f.new_path for f in unidiff.parse(fresh, "fresh.diff")] == [f"b/{rel}"]
    assert gnu_patch(tmp_path, shifted, fresh) == out.text


def test_a_changed_context_line_applies_with_fuzz_and_is_shown(sources, tmp_path):
    patch = next(p for p in BOOK.patches if p.diff_path.name == "custom_worker.diff")
    hunk = patch.hunks[0]
    first = hunk.lines[0][1]  # the hunk's first (context) line, changed upstream
    text = sources[patch.module]
    assert text.count(first + "\n") == 1
    changed = text.replace(first + "\n", first + "  # reworded upstream\n")
    out = rebase_file(changed, patch.hunks)
    h = out.hunks[0]
    assert (h.state, h.fuzz) == (FUZZ, 1)
    assert any(repr(first) in s for s in h.shown) and any("reworded upstream" in s for s in h.shown)
    assert out.text == gnu_patch(tmp_path, changed, patch.diff_path, fuzz=1)
    assert rebase_file(changed, patch.hunks, max_fuzz=0).hunks[0].state == CONFLICT


def test_a_changed_removed_line_is_a_conflict_shown_with_the_upstream_text(sources):
    patch = next(p for p in BOOK.patches if p.diff_path.name == "custom_worker.diff")
    removed = next(
        text for tag, text in patch.hunks[0].lines if tag == "-" and "get_input_embeddings" in text
    )
    changed = sources[patch.module].replace(
        removed, removed.replace("get_input_embeddings", "embed_tokens")
    )
    out = rebase_file(changed, patch.hunks)
    assert out.text is None and out.hunks[0].state == CONFLICT
    shown = "\n".join(out.hunks[0].shown)
    assert "the diff expects (old lines):" in shown and "new upstream, lines" in shown
    assert "embed_tokens" in shown and "the diff wanted there (new lines):" in shown


def test_a_file_that_already_has_the_fix_is_already_upstream(sources, tmp_path):
    for patch in BOOK.patches:
        patched = gnu_patch(tmp_path, sources[patch.module], patch.diff_path)
        out = rebase_file(patched, patch.hunks)
        assert {h.state for h in out.hunks} == {UPSTREAM}, patch.diff_path.name
        assert out.text == patched


def test_one_conflict_among_clean_hunks_writes_no_text(sources):
    patch = next(p for p in BOOK.patches if len(p.hunks) > 2)
    last_removed = next(text for tag, text in reversed(patch.hunks[-1].lines) if tag == "-")
    changed = sources[patch.module].replace(last_removed + "\n", last_removed + "  # changed\n", 1)
    out = rebase_file(changed, patch.hunks)
    states = [h.state for h in out.hunks]
    assert states[-1] == CONFLICT and set(states[:-1]) == {CLEAN} and out.text is None
