"""What sudo and the agent would run, judged without a lab, on real files and directories of this
machine (made here, owned and moded with chown/chmod; the tests run as root like the rest of the
suite):

- the client's judgement of a `become` host's `python:` from lstat answers (plans/pathtrust.py), fed
  here by os.lstat and os.readlink as the node's SFTP server feeds it;
- the agent's walk of what an importing check would import (remote_scripts/core/importtrust.py)."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from fleetops.plans.pathtrust import Entry, judge_interpreter, writers_problem
from remote_scripts.core import importtrust
from remote_scripts.core.nodeio import NodeError

NOBODY = 65534
LOGIN = 4242
TRUSTED = frozenset({0, LOGIN})


def lstat(path: str) -> Entry | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return Entry(st.st_mode, st.st_uid, st.st_gid)


def judge(python: Path):
    return judge_interpreter(str(python), lstat, os.readlink, TRUSTED)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv-shaped tree, root's and writable by root alone, its python a symlink to the
    system's."""
    tmp_path.chmod(0o755)
    top = tmp_path / "venv"
    (top / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), top / "bin" / "python")
    (top / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for path in (top, top / "bin"):
        path.chmod(0o755)
    (top / "pyvenv.cfg").chmod(0o644)
    # the temp dir's own parents (/tmp is sticky) must pass for the venv to pass
    assert judge(top / "bin" / "python") is None, judge(top / "bin" / "python")
    return top


def test_a_group_writable_bin_is_refused_even_when_its_python_execs_the_system_one(venv):
    bindir = venv / "bin"
    (bindir / "python").unlink()
    (bindir / "python").write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    (bindir / "python").chmod(0o755)
    bindir.chmod(0o775)
    problem = judge(bindir / "python")
    assert problem is not None and problem.path == str(bindir), problem
    assert (
        "writable by its group" in problem.describe() and "drwxrwxr-x (0775)" in problem.describe()
    )
    assert "chmod go-w " + str(bindir) in problem.describe()


def test_the_interpreter_file_owned_by_another_user_or_writable_by_others_is_refused(venv):
    (venv / "bin" / "python").unlink()
    real = venv / "bin" / "python3.x"
    real.write_text("#!/bin/sh\n")
    os.symlink("python3.x", venv / "bin" / "python")
    real.chmod(0o757)
    problem = judge(venv / "bin" / "python")
    assert problem is not None and problem.path == str(real) and "writable by others" in problem.why
    real.chmod(0o755)
    os.chown(real, NOBODY, 0)
    problem = judge(venv / "bin" / "python")
    assert problem is not None and f"owned by uid {NOBODY}" in problem.why
    os.chown(real, LOGIN, 0)  # the login user's own file: only it and root may change it
    assert judge(venv / "bin" / "python") is None


def test_a_symlink_is_followed_and_its_target_and_the_targets_directories_judged(venv, tmp_path):
    team = tmp_path / "team"
    team.mkdir()
    (team / "python3").write_text("#!/bin/sh\n")
    (team / "python3").chmod(0o755)
    team.chmod(0o2775)  # a team's directory: its group may replace python3
    (venv / "bin" / "python").unlink()
    os.symlink(team / "python3", venv / "bin" / "python")
    problem = judge(venv / "bin" / "python")
    assert problem is not None and problem.path == str(team) and "on the way" in problem.why, (
        problem
    )
    team.chmod(0o755)
    assert judge(venv / "bin" / "python") is None
    # one relative step up and into it: resolved component by component, as the kernel does
    (venv / "bin" / "python").unlink()
    os.symlink("../../team/python3", venv / "bin" / "python")
    assert judge(venv / "bin" / "python") is None
    team.chmod(0o775)
    assert judge(venv / "bin" / "python").path == str(team)


def test_a_sticky_directory_on_the_way_passes_but_a_link_another_user_owns_there_does_not(tmp_path):
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (tmp_path / "py").write_text("#!/bin/sh\n")
    (tmp_path / "py").chmod(0o755)
    link = shared / "python"
    os.symlink(tmp_path / "py", link)
    assert judge(link) is None
    os.lchown(link, NOBODY, NOBODY)
    problem = judge(link)
    assert (
        problem is not None
        and problem.path == str(link)
        and f"symlink owned by uid {NOBODY}" in problem.why
    )


def test_pyvenv_cfg_that_others_may_write_is_refused_and_a_relative_python_is_never_guessed(venv):
    (venv / "pyvenv.cfg").chmod(0o666)
    problem = judge(venv / "bin" / "python")
    assert problem is not None and problem.path == str(venv / "pyvenv.cfg"), problem
    problem = judge_interpreter("python3", lstat, os.readlink, TRUSTED)
    assert problem is not None and "absolute path" in problem.describe()
    problem = judge(venv / "bin" / "nothing-here")
    assert problem is not None and "does not exist" in problem.why


def test_writers_problem_reads_owner_and_mode_bits():
    dir_mode = stat.S_IFDIR
    assert (
        writers_problem("/x", Entry(dir_mode | 0o755, 0, 0), TRUSTED, on_way=True, sticky_ok=True)
        == ""
    )
    assert (
        writers_problem("/x", Entry(dir_mode | 0o1777, 0, 0), TRUSTED, on_way=True, sticky_ok=True)
        == ""
    )
    assert "others" in writers_problem(
        "/x", Entry(dir_mode | 0o1777, 0, 0), TRUSTED, on_way=False, sticky_ok=False
    )
    assert "group (gid 7)" in writers_problem(
        "/x", Entry(stat.S_IFREG | 0o775, LOGIN, 7), TRUSTED, on_way=False, sticky_ok=False
    )
    assert "uid 1001" in writers_problem(
        "/x", Entry(stat.S_IFREG | 0o755, 1001, 0), TRUSTED, on_way=False, sticky_ok=False
    )


# ---------------------------------------------------------------- the agent: what an import would
# read
@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """A site-packages directory on sys.path with a package `fleetopsdemo` (a subpackage, bytecode)
    and a single-module `fleetopsone`, every part root's and writable by root alone."""
    tmp_path.chmod(0o755)
    site = tmp_path / "site-packages"
    pkg = site / "fleetopsdemo"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"")
    (site / "fleetopsone.py").write_text("")
    (site / "__pycache__").mkdir()
    (site / "__pycache__" / "fleetopsone.cpython-311.pyc").write_bytes(b"")
    for path in [site, *site.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    assert importtrust.check_before_import(["fleetopsdemo.sub", "fleetopsone"], "import them") == []
    return site


@pytest.mark.parametrize(
    "where",
    [
        "fleetopsdemo",
        "fleetopsdemo/sub/__pycache__",
        "fleetopsdemo/sub/__pycache__/__init__.cpython-311.pyc",
        "fleetopsdemo/__init__.py",
        "__pycache__/fleetopsone.cpython-311.pyc",
        "fleetopsone.py",
    ],
)
def test_a_group_writable_part_of_the_import_path_is_refused_with_path_mode_and_owner(site, where):
    path = site / where
    path.chmod(0o775 if path.is_dir() else 0o664)
    with pytest.raises(NodeError) as refused:
        importtrust.check_before_import(["fleetopsdemo.sub.x", "fleetopsone"], "import them")
    msg = str(refused.value)
    assert refused.value.kind == "untrusted_venv" and refused.value.details["path"] == str(path), (
        msg
    )
    assert f"{path} is writable by its group" in msg and ("(0775)" in msg or "(0664)" in msg), msg
    assert "owner uid 0" in msg and "--allow-insecure-venv" in msg, msg


def test_a_file_another_user_owns_anywhere_in_the_site_dir_is_refused(site):
    """What the named modules import in turn sits beside them: the whole site dir they were found
    in."""
    other = site / "otherlib"
    other.mkdir(mode=0o755)
    (other / "__init__.py").write_text("")
    os.chown(other / "__init__.py", NOBODY, NOBODY)
    with pytest.raises(NodeError) as refused:
        importtrust.check_before_import(["fleetopsdemo"], "import fleetopsdemo")
    assert f"owned by uid {NOBODY}" in str(refused.value)


def test_a_namespace_package_part_and_a_symlinked_target_are_judged(site, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "nspkg").mkdir(parents=True)
    elsewhere.chmod(0o755)
    (elsewhere / "nspkg").chmod(0o777)
    os.symlink(elsewhere / "nspkg", site / "nspkg")
    with pytest.raises(NodeError) as refused:
        importtrust.check_before_import(["nspkg.mod"], "import nspkg")
    assert str(elsewhere / "nspkg") in str(refused.value) and "others" in str(refused.value)


def test_the_login_user_under_sudo_is_trusted_and_no_one_else(site, monkeypatch):
    path = site / "fleetopsdemo" / "__init__.py"
    os.chown(path, LOGIN, LOGIN)
    monkeypatch.setenv("SUDO_UID", str(LOGIN))
    assert importtrust.check_before_import(["fleetopsdemo"], "import fleetopsdemo") == []
    monkeypatch.setenv("SUDO_UID", str(LOGIN + 1))
    with pytest.raises(NodeError):
        importtrust.check_before_import(["fleetopsdemo"], "import fleetopsdemo")


def test_the_walk_of_a_site_dir_of_a_thousand_files_takes_milliseconds(site):
    bulk = site / "bulk"
    bulk.mkdir(mode=0o755)
    for n in range(1000):
        (bulk / f"m{n}.py").write_text("")
        (bulk / f"m{n}.py").chmod(0o644)
    started = time.perf_counter()
    assert importtrust.check_before_import(["fleetopsdemo"], "import fleetopsdemo") == []
    took = time.perf_counter() - started
    assert took < 0.5, took


def test_the_extraction_driver_refuses_before_importing_from_a_package_others_may_write(
    site, capsys
):
    from remote_scripts.jobs import extract_hidden_states

    spec = site / "speculators"
    spec.mkdir(mode=0o755)
    (spec / "__init__.py").write_text("raise SystemExit('imported')\n")
    assert extract_hidden_states._import_path_refused() is None
    spec.chmod(0o775)
    assert extract_hidden_states._import_path_refused() == 2
    err = capsys.readouterr().err
    assert "fleetops extract: refusing to run the extraction (it imports speculators" in err
    assert f"{spec} is writable by its group" in err and "--allow-insecure-venv" in err, err
