"""`fab playbook.lint`, no network, no node: every kind of problem reported with file:line, all
of them in one run; the shipped playbooks are clean; the task's exit status and output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, run_fab

from fleetops.plans.lint import Problem, lint

GOOD_DIFF = (REPO / "playbooks/speculators-0.3.0-vllm-0.16/custom_worker.diff").read_text()
WORKER = "speculators.data_generation.custom_worker"


def project(tmp_path: Path, playbook: str, files: dict[str, str] | None = None) -> Path:
    (tmp_path / "fabfile.py").write_text("")  # marks the project root for file references
    book = tmp_path / "playbooks" / "p.yaml"
    book.parent.mkdir(parents=True, exist_ok=True)
    book.write_text(playbook)
    for rel, text in (files or {}).items():
        (book.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        (book.parent / rel).write_text(text)
    return book


def only(problems: list[Problem], kind: str) -> Problem:
    assert [p.kind for p in problems] == [kind], [str(p) for p in problems]
    return problems[0]


@pytest.mark.parametrize(
    "path",
    [
        "playbooks/speculators-0.3.0-vllm-0.16.yaml",
        "tests/playbooks/jobs.yaml",
        "tests/playbooks/known-wrong-fixes.yaml",
    ],
)
def test_shipped_playbooks_are_clean(path):
    assert lint(REPO / path) == []


def test_unknown_keys_and_kinds_are_schema_errors_with_their_lines(tmp_path):
    book = project(
        tmp_path,
        "name: t\nrequire:\n  - vllm\nverify:\n  - name: c\n    kind: grepp\n    module: a\n",
    )
    problems = lint(book)
    assert [(p.kind, p.line) for p in problems] == [("schema", 2), ("schema", 6)], [
        str(p) for p in problems
    ]
    assert "unknown key 'require'" in problems[0].message
    assert "unknown check kind 'grepp'" in problems[1].message
    assert str(problems[0]).startswith(f"{book}:2: schema: ")


def test_a_patch_entry_needs_a_module_and_one_of_diff_or_script(tmp_path):
    book = project(
        tmp_path,
        "name: t\npatches:\n  - diff: d.diff\n    extra: 1\n  - module: a.b\n",
        {"d.diff": GOOD_DIFF},
    )
    problems = lint(book)
    assert [(p.kind, p.line) for p in problems] == [("schema", 4), ("schema", 3), ("schema", 5)], [
        str(p) for p in problems
    ]


def test_missing_and_escaping_file_references(tmp_path):
    book = project(
        tmp_path,
        f"name: t\npatches:\n  - module: {WORKER}\n    diff: nowhere.diff\n"
        f"  - module: {WORKER}\n    diff: ../../etc/passwd\n"
        "verify:\n  - kind: probe\n    script: missing.py\n",
    )
    problems = lint(book)
    assert [(p.kind, p.line) for p in problems] == [("file", 4), ("file", 6), ("file", 9)], [
        str(p) for p in problems
    ]
    assert "file not found: nowhere.diff" in problems[0].message
    assert "outside" in problems[1].message


def test_regexes_that_do_not_compile(tmp_path):
    book = project(
        tmp_path, "name: t\nverify:\n  - kind: grep\n    module: a.b\n    pattern: 'x(('\n"
    )
    p = only(lint(book), "regex")
    assert p.line == 5 and "bad regex" in p.message


def test_a_job_regex_that_does_not_compile(tmp_path):
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    (tmp_path / "fabfile.py").write_text("")
    book = tmp_path / "playbooks/speculators-0.3.0-vllm-0.16.yaml"
    text = book.read_text()
    assert "    failures:\n" in text
    book.write_text(text.replace("    failures:\n", "    failures:\n      - 'broken[('\n", 1))
    p = only(lint(book), "regex")
    assert p.line and "broken[(" in p.message, str(p)


def test_a_diff_that_does_not_parse_names_its_own_file_and_line(tmp_path):
    broken = GOOD_DIFF.replace("@@ -", "@@ -x", 1)
    book = project(
        tmp_path, f"name: t\npatches:\n  - module: {WORKER}\n    diff: d.diff\n", {"d.diff": broken}
    )
    p = only(lint(book), "diff")
    assert p.path.endswith("d.diff") and p.line == 3 and "malformed hunk header" in p.message


def test_a_diff_whose_counts_lie(tmp_path):
    lines = GOOD_DIFF.splitlines(keepends=True)
    at = next(i for i, x in enumerate(lines) if x.startswith("-") and not x.startswith("---"))
    broken = "".join(lines[:at] + lines[at + 1 :])  # a removed line gone, the header unchanged
    book = project(
        tmp_path, f"name: t\npatches:\n  - module: {WORKER}\n    diff: d.diff\n", {"d.diff": broken}
    )
    p = only(lint(book), "diff")
    assert p.path.endswith("d.diff") and "counts do not match" in p.message


def test_a_diff_for_another_module(tmp_path):
    book = project(
        tmp_path,
        "name: t\npatches:\n  - module: speculators.data_generation.other\n    diff: d.diff\n",
        {"d.diff": GOOD_DIFF},
    )
    p = only(lint(book), "diff")
    assert p.path.endswith("d.diff") and p.line == 1
    assert "speculators/data_generation/custom_worker.py" in p.message
    assert "speculators/data_generation/other.py" in p.message


def test_patch_scripts_compile_and_define_transform(tmp_path):
    book = project(
        tmp_path,
        f"name: t\npatches:\n  - module: {WORKER}\n    script: s/bad.py\n"
        f"  - module: {WORKER}\n    script: s/none.py\n"
        f"  - module: {WORKER}\n    script: s/args.py\n",
        {
            "s/bad.py": "def transform(text):\n    return text.replace('a', 'b'\n",
            "s/none.py": "def change(text):\n    return text\n",
            "s/args.py": "import re\n\n\ndef transform(text, extra):\n    return text\n",
        },
    )
    problems = lint(book)
    assert [(Path(p.path).name, p.kind, p.line) for p in problems] == [
        ("bad.py", "script", 2),
        ("none.py", "script", 1),
        ("args.py", "script", 4),
    ], [str(p) for p in problems]
    assert "does not compile" in problems[0].message
    assert "transform(text: str) -> str" in problems[1].message


def test_a_probe_that_does_not_compile(tmp_path):
    book = project(
        tmp_path,
        "name: t\nverify:\n  - kind: probe\n    script: probe.py\n",
        {"probe.py": "import json\nprint(json.dumps({'ok': True})\n"},
    )
    p = only(lint(book), "script")
    assert p.path.endswith("probe.py") and p.line == 2


def test_bad_requirements(tmp_path):
    book = project(tmp_path, "name: t\nrequires:\n  - vllm==0.16.*\n  - 'speculators>>0.3'\n")
    p = only(lint(book), "requires")
    assert p.line == 4


def test_all_problems_in_one_run(tmp_path):
    book = project(
        tmp_path,
        f"name: t\nbogus: 1\npatches:\n  - module: {WORKER}\n    diff: nope.diff\n"
        "verify:\n  - kind: grep\n    module: a.b\n    pattern: '('\n",
    )
    assert [p.kind for p in lint(book)] == ["schema", "file", "regex"]


def test_yaml_syntax_error(tmp_path):
    book = project(tmp_path, "name: t\npatches: [\n")
    p = only(lint(book), "schema")
    assert p.line


# ---------------------------------------------------------------- the task, as typed
def test_fab_playbook_lint_exit_status_and_output(tmp_path):
    assert (proc := run_fab(REPO, "playbook.lint")).returncode == 0, proc.stdout + proc.stderr
    assert "ok (schema, files, regexes, diffs, scripts)" in proc.stdout
    shutil.copytree(REPO / "playbooks", tmp_path / "playbooks")
    (tmp_path / "fabfile.py").write_text("")
    bad = tmp_path / "playbooks/speculators-0.3.0-vllm-0.16.yaml"
    bad.write_text(bad.read_text().replace("pattern: 'block_hasher'", "pattern: 'block_hasher('"))
    proc = run_fab(REPO, "playbook.lint", "-p", str(bad))
    assert proc.returncode == 1
    assert f"{bad}:" in proc.stdout and ": regex: bad regex 'block_hasher('" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    proc = run_fab(REPO, "playbook.lint", "-p", str(bad), "--json")
    doc = json.loads(proc.stdout)
    assert (
        proc.returncode == 1
        and doc["problems"][0]["kind"] == "regex"
        and doc["problems"][0]["line"]
    )
    proc = run_fab(REPO, "playbook.lint", "-p", str(tmp_path / "none.yaml"))
    # an error: stderr
    assert proc.returncode == 2 and "no such playbook" in proc.stderr and not proc.stdout


def test_the_loader_takes_a_script_patch_and_refuses_a_broken_one_with_its_line(tmp_path):
    from fleetops.plans.playbook import load_playbook
    from fleetops.plans.yamlsrc import ConfigError

    book = project(
        tmp_path,
        f"name: t\npatches:\n  - module: {WORKER}\n    script: s/fix.py\n",
        {"s/fix.py": "def transform(text):\n    return text\n"},
    )
    request = load_playbook(book).patch_request()["patches"][0]
    assert request["script"].startswith("def transform") and request["hunks"] == []
    assert len(request["script_sha256"]) == 64 and request["script_name"] == "fix.py"
    assert lint(REPO / "tests/playbooks/script-patch.yaml") == []
    (book.parent / "s/fix.py").write_text("import re\n\ndef change(text):\n    return text\n")
    with pytest.raises(ConfigError) as err:
        load_playbook(book)
    assert "fix.py:1:" in str(err.value) and "transform" in str(err.value)
    both = project(
        tmp_path,
        f"name: t\npatches:\n  - module: {WORKER}\n    script: s/fix.py\n    diff: d.diff\n",
        {"d.diff": GOOD_DIFF},
    )
    with pytest.raises(ConfigError) as err:
        load_playbook(both)
    assert "not both" in str(err.value)
