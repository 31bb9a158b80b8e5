"""Who runs fleetops: "user@machine", written into every agent request and every audit line.

The user is the login of the process's real uid in the password database, never $USER or $LOGNAME:
those are whatever the environment says (sudo keeps them, a script can set them), and an audit line
must name who ran."""

from __future__ import annotations

import os
import socket

_OPERATOR: str | None = None
_LOGIN: tuple[int, str] | None = None


def login() -> tuple[int, str]:
    """(uid, login name) of this process from the OS; the name is the uid's digits when the password
    database has no entry for it (some containers)."""
    global _LOGIN
    if _LOGIN is None:
        import pwd

        uid = os.getuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        _LOGIN = (uid, name)
    return _LOGIN


def operator() -> str:
    global _OPERATOR
    if _OPERATOR is None:
        _OPERATOR = f"{login()[1]}@{socket.gethostname()}"
    return _OPERATOR
