"""How the client starts the bootstrap (fleetops/wire/bundle.py launch_words): a node whose Python
is the client's very one runs the bootstrap compiled by the client and takes the zip's compiled
modules without importlib.util; any other Python compiles the bootstrap's text, as before. Either
way the agent answers and the three launcher words are gone from the argv the bootstrap reads. (-X
importtime shows what was imported.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.wire.bundle import PYTHON_FLAGS, agent_bundle, launch_words
from remote_scripts.core.protocol import PROTOCOL

ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """A node venv of the client's own Python (the same version, so the same bytecode) with nothing
    installed: the client's venv and the base interpreter's site-packages have .pth files that
    import importlib.util."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=ENV)
    return venv / "bin" / "python"


def start(python: Path, state: Path, words: tuple[str, ...]) -> subprocess.CompletedProcess:
    b = agent_bundle()
    (state / "bin").mkdir(mode=0o700, parents=True, exist_ok=True)
    state.chmod(0o700)
    pyz = state / "bin" / b.filename
    pyz.write_bytes(b.data)
    pyz.chmod(0o600)
    ping = json.dumps(
        {"protocol": PROTOCOL, "state_dir": str(state), "operator": "t@lab", "op": "ping", "_id": 1}
    )
    return subprocess.run(
        [str(python), *PYTHON_FLAGS, "-X", "importtime", *words, str(state), str(pyz), b.sha256],
        input=ping + "\n",
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    return {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_the_clients_own_python_runs_the_compiled_bootstrap_and_modules(python, tmp_path):
    proc = start(python, tmp_path / "state", launch_words())
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and answer["ok"], proc.stdout + proc.stderr
    assert "importlib.util" not in imported(proc)


def test_another_python_compiles_the_text_and_compares_magic_numbers(python, tmp_path):
    dash_c, launcher, tag, code, source = launch_words()
    proc = start(python, tmp_path / "state", (dash_c, launcher, "cpython-0-0", code, source))
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and answer["ok"], proc.stdout + proc.stderr
    assert "importlib.util" in imported(proc)


def test_the_bootstrap_reads_its_own_words_only(python, tmp_path):
    """A refusal names the state dir the client gave: the launcher's words never shift the
    bootstrap's argv."""
    dash_c, launcher, tag, code, source = launch_words()
    for words in ((dash_c, launcher, tag, code, source), (dash_c, launcher, "other", code, source)):
        proc = subprocess.run(
            [str(python), *PYTHON_FLAGS, *words, str(tmp_path / "nowhere"), "x.pyz", "0" * 64],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
        (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
        assert proc.returncode == 3 and answer["bootstrap"] is True, proc.stdout + proc.stderr
        assert str(tmp_path / "nowhere") in answer["error"], answer


def test_a_start_imports_neither_importlib_machinery_nor_struct(python, tmp_path):
    # each is an import of every agent start that it can do without (~0.6 and ~0.3 ms of node CPU)
    proc = start(python, tmp_path / "state", launch_words())
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and answer["ok"], proc.stdout + proc.stderr
    assert "remote_scripts.core.agent" in imported(proc)
    # what the stdlib modules every start needs import on this Python is not the agent's to avoid
    # (Python 3.13's threading imports warnings)
    stdlib = subprocess.run(
        [str(python), *PYTHON_FLAGS, "-X", "importtime", "-c", "import json, signal, threading"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    avoidable = {"importlib", "importlib.machinery", "warnings", "struct", "typing"}
    avoidable -= imported(stdlib)
    assert avoidable >= {"importlib.machinery", "struct", "typing"}
    assert not avoidable & imported(proc)


def test_the_bootstrap_reads_the_zip_as_zipfile_does():
    import io
    import zipfile

    from remote_scripts.core import bootstrap

    data = agent_bundle().data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        want = {name: zf.read(name) for name in zf.namelist()}
    got = {name: bootstrap.inflate(member) for name, member in bootstrap.members(data)}
    assert got == want and len(got) > 50


def _text_of(word: str) -> str:
    import binascii
    import zlib

    return zlib.decompress(binascii.a2b_base64(word)).decode("utf-8")


def test_the_bootstrap_text_travels_without_comments_or_docstrings_each_line_in_place():
    import ast
    import dis
    import io
    import tokenize

    from fleetops.wire.bundle import BOOTSTRAP

    words = launch_words()
    lean = _text_of(words[4])
    assert sum(len(w) for w in words) < 29_000  # was 31,715 with the whole text
    assert not [
        t
        for t in tokenize.generate_tokens(io.StringIO(lean).readline)
        if t.type == tokenize.COMMENT
    ]
    tree = ast.parse(lean)
    assert not [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and ast.get_docstring(n) is not None
    ]
    whole, kept = BOOTSTRAP.splitlines(), lean.splitlines()
    assert len(kept) == len(whole)
    # each line where bootstrap.py has it: a traceback still points there
    for line, original in zip(kept, whole):
        assert not line or line.strip() == "pass" or original.startswith(line), (line, original)

    def program(text: str) -> list:
        def walk(code):
            yield code
            for const in code.co_consts:
                if hasattr(const, "co_code"):
                    yield from walk(const)

        # a jump's target moves with the NOP a dropped docstring leaves (3.10's SETUP_FINALLY too)
        def arg(i: dis.Instruction) -> str:
            jumps = "JUMP" in i.opname or i.opname.startswith("FOR_ITER")
            if jumps or i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
                return ""
            return getattr(i.argval, "co_name", None) or i.argrepr

        return [
            (
                c.co_name,
                c.co_firstlineno,
                [(i.opname, arg(i)) for i in dis.get_instructions(c) if i.opname != "NOP"],
            )
            for c in walk(compile(text, "<b>", "exec", dont_inherit=True, optimize=2))
        ]

    # the same program: only what optimize=2 drops anyway is gone
    assert program(lean) == program(BOOTSTRAP)


def test_the_launch_words_are_kept_for_the_next_run(tmp_path, monkeypatch):
    from fleetops.wire import bundle

    made = launch_words()
    monkeypatch.setattr(bundle, "CACHE_DIR", tmp_path)
    bundle.launch_words.cache_clear()
    try:
        assert bundle.launch_words() == made
        (kept,) = tmp_path.glob("launch-*.json")
        assert json.loads(kept.read_text())["source"] == made[4]
        kept.write_text(json.dumps({"bootstrap": "another text", "code": "eA==", "source": "eA=="}))
        bundle.launch_words.cache_clear()
        assert bundle.launch_words() == made  # kept for another bootstrap text: made again
        kept.write_text("{torn")
        bundle.launch_words.cache_clear()
        assert bundle.launch_words() == made
        assert json.loads(kept.read_text())["code"] == made[3]
    finally:
        bundle.launch_words.cache_clear()


def _codes(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from _codes(const)


def test_the_compiled_bootstrap_keeps_its_line_numbers_and_leaves_out_column_positions():
    import binascii
    import marshal
    import zlib

    from fleetops.wire.bundle import BOOTSTRAP

    words = launch_words()
    # 31,715 with the whole text and every column position; ~22,960 on the client's Python 3.11 and
    # ~23,290 on 3.13 (its bytecode is larger) with the zip verdict's reader
    assert sum(len(w) for w in words) < 24_000
    code = marshal.loads(zlib.decompress(binascii.a2b_base64(words[3])))
    ours = compile(BOOTSTRAP, "<fleetops bootstrap>", "exec", dont_inherit=True, optimize=2)
    for sent, made in zip(_codes(code), _codes(ours)):
        assert sent.co_code == made.co_code and sent.co_name == made.co_name
        # the same lines
        assert list(sent.co_lines()) == list(made.co_lines())
        if sys.version_info >= (3, 11):  # before 3.11 code keeps no column positions at all
            assert [p[0] for p in sent.co_positions()] == [p[0] for p in made.co_positions()]
            assert {p[2:] for p in sent.co_positions()} == {(None, None)}


def test_without_a_child_interpreter_the_bootstrap_is_compiled_here(monkeypatch):
    import binascii
    import marshal
    import zlib

    from fleetops.wire import bundle

    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    code = marshal.loads(zlib.decompress(binascii.a2b_base64(bundle._launch_code())))
    assert code.co_filename == "<fleetops bootstrap>" and "main" in code.co_names
