"""The node's one writer (atomicio.atomic_write), in-process on a real directory: a target that is a
symlink, or whose directory (or one on its path) a user other than root and the login user may
change, is refused with the path, its mode and owner, and nothing is written; mode and owner of a
replaced file are set on the open file. Refusal hints never tell the operator to chmod a directory
every user shares (/tmp)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from remote_scripts.core import bootstrap
from remote_scripts.core.atomicio import TMP_MARK, UnsafeTarget, atomic_write, os_error_message

OTHER_UID = 4242  # no user of this machine: another user's files, without making one


@pytest.fixture
def home(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail(
            "these tests chown files to another uid: run "
            "them as root (the lab's tests run as root)",
            pytrace=False,
        )
    top = tmp_path / "venv"
    (top / "pkg").mkdir(parents=True)
    top.chmod(0o755)
    (top / "pkg").chmod(0o755)
    (top / "pkg" / "mod.py").write_text("original\n")
    return top


def _left(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if TMP_MARK in p.name]


def test_a_symlink_target_is_refused_and_its_file_untouched(home, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    link = home / "pkg" / "mod.py"
    link.unlink()
    link.symlink_to(victim)
    with pytest.raises(UnsafeTarget) as caught:
        atomic_write(str(link), b"new\n", like=str(link))
    msg = str(caught.value)
    assert (
        f"refusing to write {link}: {link} is a symlink (to {victim})" in msg
        and "owner uid 0" in msg
    ), msg
    assert link.is_symlink() and victim.read_text() == "root only\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and _left(home / "pkg") == []


@pytest.mark.parametrize("where", ["pkg", "."])
def test_a_group_writable_directory_on_the_way_is_refused_naming_path_mode_owner(home, where):
    loose = (home / where).resolve()
    loose.chmod(0o775)
    target = home / "pkg" / "mod.py"
    with pytest.raises(UnsafeTarget) as caught:
        atomic_write(str(target), b"new\n", like=str(target))
    msg = str(caught.value)
    assert f"{loose} " in msg and "is writable by group or others" in msg, msg
    assert "drwxrwxr-x (0775), owner uid 0" in msg and f"chmod go-w {loose}" in msg, msg
    assert caught.value.details == {"path": str(loose), "mode": "0775", "uid": 0}
    assert (
        os_error_message(caught.value, f"cannot patch {target}") == f"cannot patch {target}: {msg}"
    )
    assert target.read_text() == "original\n" and _left(home / "pkg") == []


def test_a_directory_another_user_owns_is_refused(home):
    os.chown(home / "pkg", OTHER_UID, OTHER_UID)
    target = home / "pkg" / "new.json"
    with pytest.raises(UnsafeTarget) as caught:
        atomic_write(str(target), b"{}\n", mode=0o600)
    msg = str(caught.value)
    assert f"{home / 'pkg'} is owned by uid {OTHER_UID}, not by root or the login user" in msg, msg
    assert f"owner uid {OTHER_UID}" in msg and not target.exists() and _left(home / "pkg") == []


def test_the_login_user_behind_sudo_may_own_the_directory(home, monkeypatch):
    os.chown(home / "pkg", OTHER_UID, OTHER_UID)
    target = home / "pkg" / "mod.py"
    monkeypatch.setenv("SUDO_UID", str(OTHER_UID))
    atomic_write(str(target), b"new\n", like=str(target))
    assert target.read_text() == "new\n"
    monkeypatch.setenv("SUDO_UID", str(OTHER_UID + 1))
    with pytest.raises(UnsafeTarget):
        atomic_write(str(target), b"newer\n", like=str(target))
    assert target.read_text() == "new\n"


def test_a_replaced_file_keeps_its_mode_and_owner(home):
    target = home / "pkg" / "mod.py"
    os.chown(target, OTHER_UID, OTHER_UID)
    target.chmod(0o640)
    atomic_write(str(target), b"patched\n", like=str(target))
    st = target.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (OTHER_UID, OTHER_UID, 0o640)
    assert target.read_text() == "patched\n" and _left(home / "pkg") == []


def test_a_file_directly_in_a_shared_sticky_directory_is_refused_without_a_chmod_hint(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(UnsafeTarget) as caught:
        atomic_write(str(shared / "x.json"), b"{}\n", mode=0o600)
    msg = str(caught.value)
    assert (
        "never chmod it" in msg and "chmod go-w" not in msg and not (shared / "x.json").exists()
    ), msg


@pytest.mark.parametrize("shared", ["/tmp", "/var/tmp", "/dev/shm"])
def test_the_bootstraps_refusal_of_a_shared_dir_suggests_a_private_state_dir(shared):
    # install() walks the state dir's parent strictly: a state dir directly under /tmp is refused
    # there
    if not os.path.isdir(shared):
        pytest.fail(f"{shared} is missing on this machine", pytrace=False)
    with pytest.raises(bootstrap.Refused) as caught:
        bootstrap.walk(shared, bootstrap.Rules(f"{shared}/fleetops"))
    msg = str(caught.value)
    assert f"chmod go-w {shared}" not in msg and "never chmod it" in msg and "state_dir:" in msg, (
        msg
    )


def test_a_temp_file_swapped_for_a_link_before_the_rename_is_refused_and_nothing_put_in_place(
    home, tmp_path, monkeypatch
):
    # Under --allow-insecure-venv another user may write the directory: one who swaps the temp file
    # for a link between its close and the rename must not have the link put in the target's place
    # as "changed".
    from remote_scripts.core import atomicio

    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    target = home / "pkg" / "mod.py"

    def swap(name: str, path: str = "") -> None:
        if name.endswith(".before_rename"):
            [tmp] = _left(home / "pkg")
            (home / "pkg" / tmp).unlink()
            (home / "pkg" / tmp).symlink_to(victim)

    monkeypatch.setattr(atomicio, "failpoint", swap)
    with pytest.raises(UnsafeTarget) as caught:
        atomic_write(str(target), b"new\n", like=str(target))
    assert "was replaced before it was put in place" in str(caught.value), str(caught.value)
    assert (
        not target.is_symlink()
        and target.read_text() == "original\n"
        and victim.read_text() == "root only\n"
    )
    assert _left(home / "pkg") == []
