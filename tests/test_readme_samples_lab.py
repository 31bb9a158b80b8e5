"""README.md kept honest: every sample output it shows is the real output of the command it is
marked with, run on a lab of our own (real sshd, real speculators 0.3.0 / vllm 0.16.0); no sample or
doc names a path of the machine that produced it; and every command the README (and bench/README.md)
tells you to type parses: its tasks exist and its flags are flags of those tasks, as Fabric's own
--help lists them.

The sample convention and the comparison (what is masked, what `…` means): tests/readmesamples.py.
scripts/readme-samples writes the blocks from a live run when an output changes on purpose."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from readmesamples import (
    NODES,
    README,
    REPO,
    TRIM,
    SampleLab,
    align,
    argv_of,
    first_difference,
    mask,
    parse_samples,
)

pytestmark = pytest.mark.lab
README_TEXT = README.read_text()
SAMPLES = parse_samples(README_TEXT)
DOCS = [README, REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Paths that name the machine a sample was made on: its home, the checkout, temp dirs, other users'
# homes.
MACHINE_PATHS = re.compile(
    r"(?<![\w.~<])(/root/|/home/\w|/Users/\w|/tmp/|/var/tmp/|/work/|/private/var/)"
    # and a diff header's a/<path>
    r"|(?<![\w/])[ab]/(root|home|Users|tmp|work)/"
)


@pytest.fixture(scope="module")
def sample_lab(lab_factory):
    """A lab of NODES nodes; SampleLab.run() sets each sample's starting state."""
    return SampleLab(lab_factory.shared(NODES, __name__).root)


# ---------------------------------------------------------------- samples against a live run
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.ident for s in SAMPLES])
def test_readme_sample_is_what_the_command_prints_on_the_lab(sample_lab, sample):
    status, live = sample_lab.run(sample)
    shown = "\n".join("    | " + line for line in live)
    if sample.exit is not None:
        assert status == sample.exit, (
            f"`{sample.command}` exited {status}; README.md:{sample.marker_line + 1} "
            f"says exit {sample.exit}. Live output:\n{shown}"
        )
    assert align(sample.body, live) is not None, (
        f"README.md:{sample.start + 1}: the sample of `{sample.command}` is not what it prints "
        f"now: {first_difference(sample.body, live)}\nLive output (run scripts/readme-samples to "
        f"write it back):\n{shown}"
    )
    # The comparison can fail: the same block with its first line's first number changed must not
    # match.
    first = next(i for i, line in enumerate(sample.body) if line.strip() not in ("", TRIM))
    changed = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), sample.body[first], count=1)
    if changed == sample.body[first]:
        changed = sample.body[first] + " (not printed)"
    assert align([*sample.body[:first], changed, *sample.body[first + 1 :]], live) is None


def test_readme_output_blocks_are_all_marked_samples():
    """A fenced block without a language tag is sample output; each must name its command (else
    nothing keeps it true), and the README shows at least the four it always has."""
    lines = README_TEXT.split("\n")
    marked = {s.start - 1 for s in SAMPLES}
    unmarked, in_fence = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            if not in_fence and line.strip() == "```" and i not in marked:
                unmarked.append(i + 1)
            in_fence = not in_fence
    assert not unmarked, (
        f"README.md: output blocks with no `<!-- sample: COMMAND -->` marker at lines {unmarked}"
    )
    commands = {s.command for s in SAMPLES}
    assert {
        "fab -H lab01 verify",
        "fab -H lab01 patch verify",
        "fab -H lab01 patch --check",
        "fab -H lab01 gpu",
    } <= commands, commands
    for s in SAMPLES:
        argv_of(s.command)  # each runs as `fab ...`


def test_no_sample_or_doc_names_a_path_of_this_machine():
    here = {str(REPO), str(REPO).lstrip("/"), str(Path.home())} - {"/", ""}
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().split("\n"), 1):
            if MACHINE_PATHS.search(line) or any(h in line for h in here):
                found.append(f"{doc.relative_to(REPO)}:{n}: {line.strip()[:160]}")
    assert not found, "machine-specific paths (show <checkout> or ~ instead):\n" + "\n".join(found)
    # The samples show the lab node's files where a user sees them: under <checkout>.
    assert "<checkout>/.lab/nodes/lab01/venv/" in README_TEXT


# ---------------------------------------------------------------- documented commands parse
def _fab(*args: str, program: str = "fab") -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cmd = [str(REPO / ".venv" / "bin" / program), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def _options(help_text: str) -> dict[str, bool]:
    """Every flag a --help lists, and whether it takes a value (`-p STRING, --playbook=STRING`)."""
    found: dict[str, bool] = {}
    for line in help_text.split("\n"):
        spec = line.strip().split("  ")[0]
        if not spec.startswith("-"):
            continue
        value = bool(re.search(r"(=[A-Z]+|\s[A-Z]+)(,|$)", spec)) and "[" not in spec
        for flag in re.findall(r"(?<![\w-])(--?[\w-]+)", spec):
            found[flag] = value
    return found


@cache
def _tasks(program: str = "fab") -> dict[str, int]:
    """Every task the program lists, with how many positional arguments it takes (`run "CMD"`): the
    project's fabfile's for `fab`, the bundled ones (`init` too) for `fleet`."""
    listed = set(re.findall(r"^  (\S+)", _fab("--list", program=program), re.M))
    namespace = "fabfile.ns" if program == "fab" else "fleetops.fab.tasks.fleet_namespace()"
    probe = (
        f"import json, fabfile, fleetops.fab.tasks; ns = {namespace}; "
        "print(json.dumps({n: len(ns[n].positional) for n in ns.task_names}))"
    )
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    positional = json.loads(proc.stdout)
    assert set(positional) == listed, (sorted(positional), sorted(listed))
    return positional


@cache
def _core(program: str) -> dict[str, bool]:
    return _options(_fab("--help", program=program))


@cache
def _task_options(task: str, program: str = "fab") -> dict[str, bool]:
    text = _fab("--help", task, program=program)
    return _options(text.split("Options:", 1)[1]) if "Options:" in text else {}


def check_fab_words(words: list[str], program: str = "fab") -> list[str]:
    """What is wrong with `fab WORDS` as typed: unknown tasks, flags the task does not take."""
    errors, i, task = [], 0, None
    options = _core(program)
    while i < len(words):
        word = words[i]
        if word == "--":  # an ad-hoc command follows: the node's words, not fab's
            break
        if word.startswith("-"):
            flag, has_value = word.split("=", 1)[0], "=" in word
            if flag not in options:
                errors.append(f"{flag} is not an option of {task or program}")
            elif options[flag] and not has_value:
                i += 1
            i += 1
            continue
        if word not in _tasks(program):
            errors.append(f"{word!r} is not a task")
            break
        task, options = word, _task_options(word, program)
        i += 1
        # its positional arguments, filled by the next plain words
        for _ in range(_tasks(program)[word]):
            if i < len(words) and not words[i].startswith("-"):
                i += 1
    return errors


def _code_spans(text: str) -> list[str]:
    """The lines of ```sh blocks and of indented code blocks, and the prose's inline code spans
    (which may run over a line break)."""
    out, prose, fence = [], [], None
    prev_blank = True
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            prose.append("")
            continue
        if fence is not None:
            if fence in ("sh", "bash", "shell", "console"):
                out.append(line)
            continue
        if line.startswith("    ") and prev_blank and not line.strip().startswith(("-", "|")):
            out.append(line.strip())
        else:
            prose.append(line)
        prev_blank = not line.strip()
    for paragraph in "\n".join(prose).split("\n\n"):
        out += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", paragraph)]
    return out


def documented_commands(text: str) -> list[list[str]]:
    commands = []
    for span in _code_spans(text):
        try:
            words = shlex.split(span, comments=True)
        except ValueError:
            continue
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # FLEETOPS_PLAYBOOK=P fab ...
            words = words[1:]
        if words and (
            Path(words[0]).name in ("fab", "fleet")
            or words[0].startswith(("./scripts/", "scripts/"))
            or re.match(r"(\.venv/bin/)?python3?$", words[0])
        ):
            commands.append(words)
    return commands


def test_every_documented_command_parses_as_typed():
    problems, seen = [], 0
    for doc in (README, REPO / "bench" / "README.md"):
        for words in documented_commands(doc.read_text()):
            typed = " ".join(words)
            program = Path(words[0]).name
            if program in ("fab", "fleet"):
                if len(words) == 1:
                    continue
                seen += 1
                problems += [
                    f"{doc.name}: `{typed}`: {e}" for e in check_fab_words(words[1:], program)
                ]
            elif words[0].startswith(("./scripts/", "scripts/")):
                seen += 1
                script = REPO / words[0]
                if not (script.is_file() and os.access(script, os.X_OK)):
                    problems.append(
                        f"{doc.name}: `{typed}`: {words[0]} is not an executable script"
                    )
                elif script.read_text().startswith("#!/usr/bin/env bash"):
                    proc = subprocess.run(
                        ["bash", "-n", str(script)], capture_output=True, text=True
                    )
                    if proc.returncode:
                        problems.append(f"{doc.name}: `{typed}`: bash -n: {proc.stderr}")
            elif len(words) > 1 and words[1].endswith(".py"):
                seen += 1
                if not words[0].startswith(".venv/"):
                    problems.append(
                        f"{doc.name}: `{typed}`: run Python scripts with the project's venv "
                        "(.venv/bin/python): a system python lacks fleetops' dependencies"
                    )
                if not (REPO / words[1]).is_file():
                    problems.append(f"{doc.name}: `{typed}`: no file {words[1]}")
    assert not problems, "\n".join(problems)
    assert seen >= 15, (
        f"only {seen} documented commands found: the README's commands are not being read"
    )


def test_every_flag_in_the_tasks_table_is_the_tasks_own():
    section = README_TEXT.split("## Tasks", 1)[1].split("\n## ", 1)[0]
    problems, checked = [], 0
    for row in re.findall(r"^\| (`.+?) \|", section, re.M):
        for span in re.findall(r"`([^`]+)`", row):
            task = None
            for word in re.sub(r"[\[\]]", " ", span).split():
                if word.startswith("--"):
                    checked += 1
                    if task is None or word not in _task_options(task):
                        problems.append(f"`{span}`: {word} is not an option of {task}")
                elif re.fullmatch(r"[a-z][\w.-]*", word):  # ssh-config, playbook.lint
                    if word not in _tasks():
                        problems.append(f"`{span}`: {word!r} is not a task")
                    task = word
    assert not problems, "\n".join(problems)
    assert checked >= 12, checked


def test_bad_flags_are_caught_by_this_check():
    """The parser above is not a rubber stamp."""
    assert check_fab_words(["-H", "lab01", "patch", "--chek"]) == [
        "--chek is not an option of patch"
    ]
    assert check_fab_words(["-H", "lab01", "pach"]) == ["'pach' is not a task"]
    assert check_fab_words(["-H", "lab01", "patch", "--check", "verify", "--kinds", "grep"]) == []
    assert check_fab_words(["lab.install", "lab02", "--vllm", "0.17.0", "lab.status"]) == []


def test_set_up_is_the_two_documented_commands():
    block = README_TEXT.split("## Set up", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line, comments=True) for line in block.strip().split("\n")]
    assert commands == [["./scripts/lab-demo"], ["./scripts/test"]], commands


def test_the_bench_command_as_documented():
    """README's bench command runs under the venv and its flags are bench/run.py's; with a python
    that is not fleetops' venv, bench/run.py says what to run instead and writes nothing (it used to
    copy its snapshot, then fail with `No module named 'invoke'`)."""
    line = next(words for words in documented_commands(README_TEXT) if "bench/run.py" in words)
    assert line[0] == ".venv/bin/python" and (REPO / line[0]).exists(), line
    probe = (
        "import runpy, sys; ns = runpy.run_path('bench/run.py', run_name='bench_run'); "
        "sys.argv = ['bench/run.py', '--help']; ns['main']()"
    )
    proc = subprocess.run(
        [str(REPO / line[0]), "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (w.split("=")[0] for w in line[2:] if w.startswith("--")):
        assert flag in proc.stdout, f"{flag} (README) is not a bench/run.py option:\n{proc.stdout}"

    bare = getattr(sys, "_base_executable", "") or sys.executable
    snapshot = REPO / "bench" / ".work" / "snapshot"
    before = snapshot.stat().st_mtime_ns if snapshot.exists() else None
    proc = subprocess.run(
        [bare, "-I", "bench/run.py", *line[2:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode == 2:
        assert " ".join(line) in proc.stderr and "nothing was written" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        assert (snapshot.stat().st_mtime_ns if snapshot.exists() else None) == before
    else:
        pytest.fail(
            f"{bare} (this venv's base python, without fleetops' dependencies) ran bench/run.py: "
            f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
        )


def test_the_library_example_runs_on_the_lab(sample_lab):
    code = README_TEXT.split("## As a library", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    sample_lab.reset()
    probe = code + "\nprint(sorted({(r.host, r.task, r.status.value) for r in results}))\n"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETOPS_AUDIT_LOG": str(sample_lab.audit)}
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=sample_lab.project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # `@lab` is every node of the sample lab (NODES of them): each patched, then verified.
    nodes = [f"lab{i:02d}" for i in range(1, NODES + 1)]
    want = sorted(
        (n, task, word) for n in nodes for task, word in (("patch", "changed"), ("verify", "ok"))
    )
    assert proc.stdout.strip() == str(want), proc.stdout


def test_masks_leave_the_facts_alone():
    """Masking hides timings, pids and ports, never counts or statuses."""
    assert mask("lab01 | verify | failed | 6/18 checks passed") != mask(
        "lab01 | verify | failed | 3/5 checks passed"
    )
    assert mask("took: 0.313s") == mask("took: 40.2s")
    assert mask("│ 25437 python3 21090MiB root 1s foreign │") == mask(
        "│ 4255 python3 21090MiB alice 12s foreign  │"
    )
    assert mask("21099/143771 MiB") != mask("21098/143771 MiB")
