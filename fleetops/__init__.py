"""fleetops: operate GPU nodes over SSH. As a library: `from fleetops.api import run` (docs/api.md);
its errors and results are exported here too (`fleetops.run` is the run module, so the function is
fleetops.api.run).

These names are loaded on first use, so `fab`'s start-up, which imports fleetops' modules but not
the library, pays nothing for them."""

from __future__ import annotations

import sys

if sys.argv and sys.argv[0].rsplit("/", 1)[-1] == "fleet":
    # The `fleet` program is starting: the first of its code Python runs, so Ctrl-C from here on is
    # one line and exit 130, never a traceback from an import (startup.py). A library caller's
    # process is left as it is.
    try:
        from .startup import guard_interrupts

        guard_interrupts()
    # inside the very imports that set the guard: the same one line and exit status
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (Ctrl-C) while starting: no task ran on any host\n")
        raise SystemExit(130) from None

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import (
        ConfigError,
        Result,
        Status,
        UnknownHost,
        UnknownOption,
        UnknownTask,
        UsageError,
    )

__all__ = [
    "ConfigError",
    "Result",
    "Status",
    "UnknownHost",
    "UnknownOption",
    "UnknownTask",
    "UsageError",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'fleetops' has no attribute {name!r}")
