"""The client's judgement, under become, of a node file it is about to read by path over SFTP
(plans/pathtrust.judge_read), fed by os.lstat and os.readlink on real files and directories made
here, as the node's SFTP server feeds it: read only through directories root and the login user
alone may change, with no symlink on the way; the ping warning the agent gives from the same walk
verify makes (importtrust)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_become_trust_units import TRUSTED, lstat  # the SFTP lstat, fed from os.lstat

from fleetops.plans.pathtrust import judge_read
from remote_scripts.core import importtrust


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out").chmod(0o755)
    (tmp_path / "out" / "sub").chmod(0o755)
    (tmp_path / "out" / "sub" / "file.txt").write_text("x")
    return tmp_path


def test_a_file_under_directories_only_trusted_users_may_change_is_read(tree):
    assert judge_read(str(tree / "out" / "sub" / "file.txt"), lstat, os.readlink, TRUSTED) is None


def test_a_directory_a_group_may_write_on_the_way_is_refused_naming_path_mode_and_owner(tree):
    (tree / "out").chmod(0o775)
    problem = judge_read(str(tree / "out" / "sub" / "file.txt"), lstat, os.readlink, TRUSTED)
    assert problem is not None and problem.path == str(tree / "out")
    text = problem.describe()
    assert (
        "(on the way to the file) is writable by its group" in text and "drwxrwxr-x (0775)" in text
    ), text


def test_a_symlink_on_the_way_is_refused_though_root_made_it(tree):
    (tree / "out" / "link").symlink_to(tree / "out" / "sub")
    problem = judge_read(str(tree / "out" / "link" / "file.txt"), lstat, os.readlink, TRUSTED)
    assert problem is not None and "is reached through a symlink" in problem.describe(), problem


def test_a_path_gone_since_the_node_listed_it_says_so(tree):
    problem = judge_read(str(tree / "out" / "gone" / "file.txt"), lstat, os.readlink, TRUSTED)
    assert problem is not None and "changed since the node listed it" in problem.describe(), problem


def test_ping_warns_of_a_package_another_group_may_write_without_importing_it(
    tmp_path, monkeypatch
):
    pkg = tmp_path / "pingtrustpkg"
    pkg.mkdir()
    tmp_path.chmod(0o755)
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importtrust.ping_warnings(["pingtrustpkg.sub"]) == []
    pkg.chmod(0o775)
    said = importtrust.ping_warnings(["pingtrustpkg.sub"])
    assert (
        len(said) == 1 and f"{pkg} is writable by its group" in said[0] and "(0775)" in said[0]
    ), said
    assert "pingtrustpkg" not in sys.modules
