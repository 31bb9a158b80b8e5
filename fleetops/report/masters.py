"""`fleet connections` and `fleet disconnect`: the OpenSSH master connections as a table or one JSON
document, and what closing them did. The data comes from fleetops.wire.masters (survey, disconnect);
this only draws."""

from __future__ import annotations

import sys
from typing import Any

from ..redaction import dumps, shown
from ..results import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .richload import escape, rich

NONE = "-"


def duration(seconds: float | None) -> str:
    """As an operator reads an age: 42s, 3m05s, 2h07m, 3d04h."""
    if seconds is None:
        return NONE
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def megabytes(kib: int | None) -> str:
    return NONE if not kib else f"{kib / 1024:.1f}M"


_LEFT = ("host", "user", "jump")


def _live_table(directory: str, live: list[dict[str, Any]]) -> None:
    """The live masters, one row each, and their memory in all when there are several."""
    table = rich().Table(
        title=escape(f"ssh master connections ({directory})"), title_justify="left"
    )
    for header in ("host", "user", "port", "jump", "age", "idle", "pid", "rss"):
        table.add_column(header, no_wrap=True, justify="left" if header in _LEFT else "right")
    for r in live:
        table.add_row(
            escape(r["host"]),
            escape(r["user"] or NONE),
            str(r["port"] or NONE),
            escape(r["jump"] or NONE),
            duration(r["age_s"]),
            duration(r["idle_s"]),
            str(r["pid"]),
            megabytes(r.get("rss_kib")),
        )
    rich().Console(emoji=False, highlight=False).print(table)
    known = [r["rss_kib"] for r in live if r.get("rss_kib")]
    if len(live) > 1 and known:
        print(
            f"{len(live)} masters, {megabytes(sum(known))} "
            "resident in all (shared pages counted in each)"
        )


def _not_live(r: dict[str, Any]) -> str | None:
    """The line for a socket whose master is gone or could not be asked; None for a live one."""
    if r["state"] == "stale":
        return (
            f"{shown(r['host'])}: stale socket {r['socket']} (its master is gone; `fleet "
            "disconnect` removes it)"
        )
    if r["state"] == "unknown":
        return f"{shown(r['host'])}: {r['error']}"
    return None


def show_connections(survey: dict[str, Any], as_json: bool = False) -> int:
    if survey["error"]:
        print(f"connections: {survey['error']}", file=sys.stderr)
        return EXIT_USAGE
    rows = survey["masters"]
    if as_json:
        sys.stdout.write(
            dumps({"directory": survey["directory"], "masters": rows}, indent=1) + "\n"
        )
        return EXIT_OK
    live = [r for r in rows if r["state"] == "live"]
    if live:
        _live_table(survey["directory"], live)
    elif survey["directory"]:
        print(f"no ssh master connections ({survey['directory']})")
    else:
        print("no ssh master connections")
    for r in rows:
        line = _not_live(r)
        if line is not None:
            print(line)
    return EXIT_OK


def show_disconnect(done: dict[str, Any], as_json: bool = False) -> int:
    if done["error"]:
        print(f"disconnect: {done['error']}", file=sys.stderr)
        return EXIT_USAGE
    closed = done["closed"]
    code = EXIT_FAILED if any(c["outcome"] == "failed" for c in closed) else EXIT_OK
    if as_json:
        sys.stdout.write(dumps({"directory": done["directory"], "closed": closed}, indent=1) + "\n")
        return code
    if not closed:
        named = done.get("hosts")
        print(
            "no ssh master connections to close"
            + (f" for {shown(', '.join(named))}" if named else "")
        )
    for c in closed:
        if c["outcome"] == "closed":
            print(f"{shown(c['host'])}: master closed ({c['detail']})")
        elif c["outcome"] == "stale":
            print(
                f"{shown(c['host'])}: stale socket {c['socket']} "
                "removed (its master was already gone)"
            )
        else:
            print(f"{shown(c['host'])}: not closed: {c['detail']}", file=sys.stderr)
    return code
