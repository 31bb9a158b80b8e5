"""The lab's file operations on its own directories: removing a path of any kind, a directory
emptied to what it should keep, a directory made a copy of another by rewriting only what
differs."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path


def remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def remove_settled(path: Path) -> None:
    """rmtree, once a stopped node's last sshd process is done with it: a connection's sshd process
    outlives the listener by a moment and may still create its log (it re-executes sshd, which opens
    `-E LOG` again)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError:
            if not path.exists():
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def emptied(path: Path, mode: int, keep: tuple[str, ...] = ()) -> None:
    """`path` a directory of ours with that mode, holding only `keep`."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, os.getuid(), os.getgid())
    path.chmod(mode)
    for entry in path.iterdir():
        if entry.name not in keep:
            remove(entry)


def _same_file(src: os.DirEntry, dst: Path) -> bool:
    try:
        have = dst.lstat()
    except FileNotFoundError:
        return False
    want = src.stat(follow_symlinks=False)
    if (
        not stat.S_ISREG(have.st_mode)
        or have.st_mode != want.st_mode
        or have.st_size != want.st_size
        or (have.st_uid, have.st_gid) != (os.getuid(), os.getgid())
    ):
        return False
    return Path(src.path).read_bytes() == dst.read_bytes()


def mirror(src: Path, dst: Path) -> None:
    """`dst` made a copy of the directory `src` (bytecode left out), rewriting only the files that
    differ."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        dst.unlink()
    dst.mkdir(exist_ok=True)
    wanted = {e.name: e for e in os.scandir(src) if e.name != "__pycache__"}
    for entry in os.scandir(dst):
        if entry.name not in wanted:
            remove(Path(entry.path))
    for name, entry in wanted.items():
        target = dst / name
        if entry.is_dir(follow_symlinks=False):
            mirror(Path(entry.path), target)
        elif not _same_file(entry, target):
            remove(target)
            shutil.copy2(entry.path, target, follow_symlinks=False)
    mode = stat.S_IMODE(src.stat().st_mode)
    info = dst.stat()
    if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
        os.chown(dst, os.getuid(), os.getgid())
    if stat.S_IMODE(info.st_mode) != mode:
        dst.chmod(mode)
