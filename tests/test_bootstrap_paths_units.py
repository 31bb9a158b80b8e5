"""The bootstrap's path walk (remote_scripts/core/bootstrap.py: walk), on real directories, without
a lab: a path is checked as written, component by component, like OpenSSH's StrictModes, and a
symlink on the way is followed only where no other user can replace it. Ownership by another user
needs root (chown)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from remote_scripts.core.bootstrap import Refused, Rules, walk

NOBODY = 65534


@pytest.fixture
def top():
    d = Path(tempfile.mkdtemp(prefix="fleetops-walk-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for root, dirs, files in os.walk(d, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            p = os.path.join(root, name)
            os.unlink(p) if os.path.islink(p) else os.rmdir(p)
    d.rmdir()


def walked(path: Path, **kw) -> os.stat_result | None:
    fd = walk(str(path), Rules(str(path)), **kw)
    if fd is None:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def refusal(path: Path, **kw) -> str:
    with pytest.raises(Refused) as info:
        walked(path, **kw)
    return str(info.value)


def test_a_plain_path_is_opened_and_a_missing_one_is_none(top):
    (top / "a" / "b").mkdir(parents=True)
    assert stat.S_ISDIR(walked(top / "a" / "b").st_mode)
    assert walked(top / "a" / "missing" / "c") is None
    (top / "a" / "f").write_text("x")
    assert stat.S_ISREG(walked(top / "a" / "f", final_dir=False).st_mode)


def test_an_others_writable_dir_on_the_way_is_refused_unless_sticky_and_the_last_one_even_then(top):
    (top / "open" / "state").mkdir(parents=True)
    (top / "open").chmod(0o777)
    msg = refusal(top / "open" / "state")
    assert (
        f"{top / 'open'} (on the way to {top / 'open' / 'state'}) is writable by group or "
        "others and not sticky"
    ) in msg and "(0777)" in msg
    (top / "open").chmod(0o1777)  # like /tmp
    assert walked(top / "open" / "state") is not None
    # the last component: sticky is no excuse
    assert "is writable by group or others [" in refusal(top / "open")


def test_a_symlink_in_an_others_writable_dir_is_refused_where_it_sits_however_it_is_reached(top):
    """sym01: the state dir reached through `link`, which sits in a 0777 directory: refused like
    direct01."""
    (top / "real" / "state").mkdir(parents=True)
    (top / "shared").mkdir(mode=0o777)
    (top / "shared").chmod(0o777)
    (top / "shared" / "link").symlink_to(top / "real")
    for path in (
        top / "shared" / "link" / "state",
        top / "real" / ".." / "shared" / "link" / "state",
    ):
        assert f"{top / 'shared'} (on the way to" in refusal(path)


def test_symlinks_in_trusted_dirs_are_followed_relative_absolute_and_dotdot(top):
    (top / "real" / "state").mkdir(parents=True)
    (top / "safe").mkdir()
    (top / "safe" / "abs").symlink_to(top / "real")
    (top / "safe" / "rel").symlink_to("../real")
    want = os.stat(top / "real" / "state").st_ino
    for path in (
        top / "safe" / "abs" / "state",
        top / "safe" / "rel" / "state",
        top / "safe" / ".." / "real" / "state",
    ):
        assert walked(path).st_ino == want, path
    (top / "safe" / "loop").symlink_to("loop")
    assert "symlink too many" in refusal(top / "safe" / "loop" / "x")


def test_the_last_component_is_never_a_symlink_unless_asked(top):
    (top / "real").mkdir()
    (top / "state").symlink_to(top / "real")
    assert f"{top / 'state'} is a symlink (to {top / 'real'})" in refusal(top / "state")
    assert walked(top / "state", final_link=True).st_ino == os.stat(top / "real").st_ino


@pytest.mark.root("chown to another user")
def test_another_users_symlink_in_a_sticky_dir_is_refused_roots_is_followed(top):
    (top / "real" / "state").mkdir(parents=True)
    (top / "sticky").mkdir()
    (top / "sticky").chmod(0o1777)
    (top / "sticky" / "mine").symlink_to(top / "real")
    (top / "sticky" / "theirs").symlink_to(top / "real")
    os.lchown(top / "sticky" / "theirs", NOBODY, NOBODY)
    assert walked(top / "sticky" / "mine" / "state") is not None
    msg = refusal(top / "sticky" / "theirs" / "state")
    assert (
        f"{top / 'sticky' / 'theirs'} (a symlink on the way to" in msg
        and f"owned by uid {NOBODY}" in msg
    )


@pytest.mark.root("chown to another user")
def test_a_dir_on_the_way_owned_by_another_user_is_refused(top):
    (top / "theirs" / "state").mkdir(parents=True)
    os.chown(top / "theirs", NOBODY, NOBODY)
    msg = refusal(top / "theirs" / "state")
    assert (
        f"{top / 'theirs'} (on the way to {top / 'theirs' / 'state'}) is owned by uid {NOBODY}"
        in msg
    )
