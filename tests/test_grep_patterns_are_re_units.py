"""A grep check's pattern is a Python regular expression, searched in each line of the file's code
(re.search, with the node's own `re`). No lab: remote_scripts' verify, in-process, on small modules
and on the real speculators files of the base venv, pristine and patched, where every shipped grep
gives the verdict its fix calls for."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

import remote_scripts.checks.checks as checks
from fleetops.plans.playbook import load_playbook

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
SOURCE = """import os


def build(config):
    engine = Engine(block_size=16, enable_prefix_caching=False,
                    max_num_seqs=256)  # enable_prefix_caching=True in 0.11
    return engine.step(7), engine.sample_tokens()
"""


def _verify(module: Path, state: Path, monkeypatch, *greps: tuple[str, str]) -> list[dict]:
    monkeypatch.setattr(checks, "module_file_in_site", lambda name: str(module))
    checks.forget_code_lines()
    answer = checks.verify(
        {
            "state_dir": str(state),
            "checks": [
                {"kind": "grep", "name": f"g{i}", "module": "pkg.mod", "pattern": p, "expect": e}
                for i, (p, e) in enumerate(greps)
            ],
        }
    )
    return answer["items"]


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "site" / "mod.py"
    path.parent.mkdir()
    path.write_text(SOURCE)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    yield path, state
    checks.forget_code_lines()


@pytest.mark.parametrize(
    ("pattern", "line"),
    [
        (r"block_size=\d+,", 5),  # a class
        # a word boundary, a group, alternation
        (r"\benable_prefix_caching=(False|None),", 5),
        (r"max_num_seqs=[0-9]{3}\)$", 6),  # a counted repeat, the line's end
        (r"^\s{4}return\s+engine\.step\(\d\),\s*engine\.sample_tokens\(\)", 7),
        (r"(?i)ENGINE\(", 5),  # an inline flag
        # a lookahead: the comment's True is not code
        (r"enable_prefix_caching=(?!True)", 5),
    ],
)
def test_a_grep_pattern_means_what_it_means_to_python_re(module, monkeypatch, pattern, line):
    path, state = module
    (item,) = _verify(path, state, monkeypatch, (pattern, "match"))
    assert item["ok"] and item["evidence"][0]["line"] == line, item
    want = [i + 1 for i, x in enumerate(checks.code_lines(SOURCE)[0]) if re.search(pattern, x)]
    assert [e["line"] for e in item["evidence"]] == want


def test_an_absent_check_fails_on_the_first_line_re_finds(module, monkeypatch):
    path, state = module
    (item,) = _verify(path, state, monkeypatch, (r"engine\.(step|sample_tokens)\(", "absent"))
    assert not item["ok"] and item["msg"].endswith(
        "must not match but does at line 7: return engine.step(7), engine.sample_tokens()"
    )


def test_a_pattern_the_nodes_re_cannot_compile_is_that_checks_failure_not_a_crash(
    module, monkeypatch
):
    # the client's lint compiles every pattern with the client's Python; a node's older Python may
    # not read it
    path, state = module
    bad, good = _verify(
        path, state, monkeypatch, (r"block_size=(", "match"), (r"block_size=16", "match")
    )
    assert not bad["ok"] and "check crashed" not in bad["msg"]
    assert bad["msg"].startswith("/block_size=(/ is not a regular expression this node's Python ")
    assert (
        "missing ), unterminated subpattern" in bad["msg"]
        and "oldest Python of the fleet" in bad["msg"]
    )
    assert good["ok"]


@pytest.mark.base_venv
def test_every_shipped_grep_tells_the_pristine_file_from_the_patched_one(
    lab_base, tmp_path, monkeypatch
):
    book = load_playbook(PLAYBOOK)
    site = next(Path(lab_base).glob("lib/python3*/site-packages"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    files = {}
    for patch in book.patches:
        pristine = site / (patch.module.replace(".", "/") + ".py")
        patched = tmp_path / pristine.name
        subprocess.run(
            ["patch", "-F0", "-s", "-o", str(patched), str(pristine), str(patch.diff_path)],
            check=True,
        )
        files[patch.module] = {"pristine": pristine, "patched": patched}
    greps = [c for c in book.checks if c["kind"] == "grep"]
    assert len(greps) == 11
    passed = {}
    for state_of in ("pristine", "patched"):
        for check in greps:
            monkeypatch.setattr(
                checks, "module_file_in_site", lambda name, s=state_of: str(files[name][s])
            )
            checks.forget_code_lines()
            (item,) = checks.verify({"state_dir": str(state), "checks": [check]})["items"]
            passed[(state_of, check["name"])] = item["ok"]
    checks.forget_code_lines()
    assert all(passed[("patched", c["name"])] for c in greps)
    # each fails on the pristine file but one: no-block-hasher guards against a wrong fix (a block
    # hasher silences the block pool's assert but keeps prefix caching's hits), and 0.3.0 never had
    # one
    assert {name for (state_of, name), ok in passed.items() if state_of == "pristine" and ok} == {
        "no-block-hasher"
    }
