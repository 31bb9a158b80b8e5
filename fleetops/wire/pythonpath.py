"""become: the inventory's `python:` checked as the login user, over SFTP lstats, before sudo runs
it.

sudo runs that path as root before any check of fleetops' can run on the node; the checks made by
the interpreter itself (the bootstrap's) come too late when someone else could have replaced it. So
the client walks the path first (plans/pathtrust.py judges what lstat says) and refuses the host,
nothing run, when anyone but root and the login user could change it. The login user's uid is the
owner of its SFTP start directory (its home)."""

from __future__ import annotations

import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..plans.inventory import Host
from ..plans.pathtrust import Entry, judge_interpreter
from ..results import Evidence
from .connector import TransportError, link_errors

if TYPE_CHECKING:
    import paramiko


def _entry(attrs: paramiko.SFTPAttributes | Any) -> Entry:
    return Entry(
        int(attrs.st_mode or 0),
        int(attrs.st_uid if attrs.st_uid is not None else -1),
        int(attrs.st_gid if attrs.st_gid is not None else -1),
    )


def check_interpreter(
    open_sftp: Callable[[], paramiko.SFTPClient | Any], host: Host, shown: str
) -> None:
    """`open_sftp()`: the connection's SFTP session, as the login user. Raises
    TransportError("untrusted") naming the path, its mode and owner, and the next step, when someone
    but root and the login user could change what `sudo PYTHON` would run."""

    sftp: paramiko.SFTPClient | Any = None

    def lstat(path: str) -> Entry | None:
        assert sftp is not None
        try:
            return _entry(sftp.lstat(path))
        except FileNotFoundError:
            return None

    user = host.user or "the login user"
    try:
        sftp = open_sftp()
        home = sftp.normalize(".")
        login = sftp.lstat(home)
        if login.st_uid is None or not stat.S_ISDIR(login.st_mode or 0):
            raise OSError(f"the SFTP start directory {home} says no owner")
        problem = judge_interpreter(
            host.python,
            lstat,
            lambda path: sftp.readlink(path) or "",
            frozenset({0, int(login.st_uid)}),
        )
    except link_errors() as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        raise TransportError(
            "untrusted",
            f"{host.name}: cannot check {host.python} as {user} before sudo runs it "
            f"as root ({reason}); nothing ran as root. fleetops reads the path with "
            "SFTP lstats: check the node's SFTP server and that "
            f"{user} may read every directory of the path",
            Evidence(shown, None, [], 0.0),
        ) from None
    if problem is not None:
        raise TransportError(
            "untrusted",
            f"{host.name}: refusing to run {host.python} through sudo: "
            f"{problem.describe()}; nothing ran as root",
            Evidence(shown, None, [], 0.0),
        )
