"""Grep checks judge code, not text. No lab: remote_scripts/checks/checks.py's code view and
verdict, on small sources and on the real speculators files of the base venv (where the shipped
playbook's greps must give the same verdicts in code mode as they did on raw text, pristine and
patched)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import ConfigError
from remote_scripts.checks.checks import DISAGREE, code_lines, disagreement

SOURCE = '''"""Module docstring naming self.get_input_embeddings( for history."""
import os  # block_hasher was here


def f(self, ids):
    # vLLM < 0.16: self.get_input_embeddings(ids)
    msg = "enable_prefix_caching=False,"
    other = f"{self.embed_input_ids(ids)} and block_hasher"
    return self.embed_input_ids(ids)


CONFIG = dict(
    enable_prefix_caching=False,
    note="""
    async_scheduling=False,
    """,
)
'''


def _search(pattern: str, source: str = SOURCE) -> list[int]:
    lines, note = code_lines(source)
    assert note == ""
    rx = re.compile(pattern)
    return [i + 1 for i, line in enumerate(lines) if rx.search(line)]


def test_code_view_keeps_line_numbers():
    lines, _ = code_lines(SOURCE)
    assert len(lines) == len(SOURCE.splitlines())


def test_a_comment_naming_a_forbidden_symbol_is_not_code():
    assert _search(r"self\.get_input_embeddings\(") == []  # docstring and comment only
    assert _search(r"block_hasher") == []  # comment and f-string literal text only


def test_a_comment_or_string_does_not_satisfy_a_match():
    assert _search(r"^\s*async_scheduling=False,") == []  # inside a triple-quoted string
    assert _search(r"enable_prefix_caching=False,") == [13]  # the string on line 7 does not count


def test_code_inside_f_string_braces_and_plain_code_still_match():
    assert 9 in _search(r"self\.embed_input_ids\(ids\)")
    assert _search(r"^\s*return self\.embed_input_ids\(ids\)$") == [9]


def test_indent_is_kept_for_anchored_patterns():
    assert _search(r"^\s{4}enable_prefix_caching=False,$") == [13]


def test_a_file_that_does_not_tokenize_is_searched_as_text_and_says_so():
    lines, note = code_lines("x = (\n  # comment block_hasher\n")
    assert "does not tokenize" in note
    assert any("block_hasher" in x for x in lines)


def test_disagreement_is_named_only_when_every_behaviour_check_passed():
    def items(probe_ok: bool) -> list[dict]:
        return [
            {"kind": "grep", "name": "no-x", "ok": False, "msg": "/x/ must not match"},
            {"kind": "grep", "name": "has-y", "ok": True, "msg": "ok"},
            {"kind": "callsites", "name": "vllm-callsites", "ok": True, "msg": "ok"},
            {"kind": "probe", "name": "probe", "ok": probe_ok, "msg": "ok"},
        ]

    agreed = items(True)
    note = disagreement(agreed)
    assert (
        note.startswith(DISAGREE)
        and "no-x failed" in note
        and "vllm-callsites, probe passed" in note
    )
    assert DISAGREE in agreed[0]["msg"] and DISAGREE not in agreed[1]["msg"]
    assert disagreement(items(False)) == ""  # the probe failed too: nothing disagrees
    # no behaviour check ran
    assert disagreement([i for i in items(True) if i["kind"] == "grep"]) == ""


def test_playbook_takes_search_text_or_code_and_refuses_others(tmp_path):
    def book(extra: str) -> Path:
        path = tmp_path / "p.yaml"
        path.write_text(
            "name: t\nverify:\n  - name: g\n    kind: grep\n    module: a.b\n    pattern: x\n"
            + extra
        )
        return path

    assert load_playbook(book("")).checks[0]["search"] == "code"
    assert load_playbook(book("    search: text\n")).checks[0]["search"] == "text"
    with pytest.raises(ConfigError) as err:
        load_playbook(book("    search: comments\n"))
    assert ":7:" in str(err.value) and "'code'" in str(err.value)


@pytest.mark.base_venv
def test_shipped_greps_agree_in_code_and_text_mode_on_real_files(lab_base, tmp_path):
    book = load_playbook(REPO / "playbooks/speculators-0.3.0-vllm-0.16.yaml")
    site = next(Path(lab_base).glob("lib/python3*/site-packages"))
    compared = 0
    for patch in book.patches:
        pristine = site / (patch.module.replace(".", "/") + ".py")
        out = tmp_path / pristine.name
        subprocess.run(
            ["patch", "-F0", "-s", "-o", str(out), str(pristine), str(patch.diff_path)], check=True
        )
        for text in (pristine.read_text(), out.read_text()):
            code, note = code_lines(text)
            assert note == ""
            for check in (
                c for c in book.checks if c["kind"] == "grep" and c["module"] == patch.module
            ):
                rx = re.compile(check["pattern"])
                assert any(rx.search(x) for x in text.splitlines()) == any(
                    rx.search(x) for x in code
                ), check
                compared += 1
    assert compared == 2 * 11
