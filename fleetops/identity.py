"""Who runs fleetops: "user@machine", written into every agent request and every audit line."""

from __future__ import annotations

import os
import socket

_OPERATOR: str | None = None


def operator() -> str:
    global _OPERATOR
    if _OPERATOR is None:
        import getpass

        try:
            user = getpass.getuser()
        except Exception:  # noqa: BLE001 - no passwd entry in some containers
            user = str(os.getuid())
        _OPERATOR = f"{user}@{socket.gethostname()}"
    return _OPERATOR
