"""One file of a patch or rollback set, as the planners and the writer share it: what is there, what
to write, and its item for the answer; with the two helpers every planner uses (who last wrote a
form, and the unified diff of a change). Stdlib only.
"""

from __future__ import annotations

from ..core.atomicio import os_error_message
from ..core.nodeio import NodeError, sha256_bytes
from ..core.protocol import FAILED, REFUSED
from ..core.sitemodules import module_file_in_site
from .hunks import split_lines
from .sitelock import SiteLock


def unified(old: str, new: str, path: str) -> str:
    import difflib  # only a change (or a refusal) shows a diff: not imported by a steady-state run

    return "".join(
        difflib.unified_diff(split_lines(old), split_lines(new), f"a{path}", f"b{path}", n=3)
    )


class SetFile:
    """One file of the set: what is there, what to write (if anything), and the item for the
    answer."""

    def __init__(self, p: dict) -> None:
        self.p = p
        self.hunks: list[dict] = p["hunks"]
        self.item: dict = {"module": p["module"], "diff": p.get("diff_name"), "changed": False}
        self.path = ""
        self.data = b""
        self.lines: list[str] = []
        self.new: bytes | None = None  # the bytes to write; None: nothing to write
        self.refusal = False  # this file stops the whole set
        self.done_msg = ""
        self.would_msg = ""
        self.extra: dict = {}  # what the answer item gets once written

    def load(self) -> bool:
        try:
            self.path = module_file_in_site(self.p["module"])
            with open(self.path, "rb") as f:
                self.data = f.read()
            try:
                text = self.data.decode("utf-8")
            except UnicodeDecodeError:
                raise NodeError(f"{self.path} is not UTF-8 text; refusing to touch it") from None
        except NodeError as exc:
            self.refuse(REFUSED, str(exc))
            return False
        except OSError as exc:
            self.refuse(FAILED, os_error_message(exc, f"cannot read {self.p['module']}"))
            return False
        self.item["file"] = self.path
        self.lines = split_lines(text)
        return True

    def refuse(self, status: str, msg: str, **extra: object) -> None:
        self.refusal = True
        self.item.update({"status": status, "ok": False, "msg": msg, **extra})

    def noop(self, status: str, msg: str, **extra: object) -> None:
        self.item.update(
            {"status": status, "ok": True, "msg": msg, "sha256": sha256_bytes(self.data), **extra}
        )

    def note(self, text: str) -> None:
        self.item.setdefault("notes", []).append(text)


def written_by(site: SiteLock | None, path: str, sha: str, form: str) -> str:
    info = site.last_writer(path, sha) if site else None
    if not info or info.get("form") != form:
        return ""
    return f" (by {info.get('host', '?')}, {info.get('operator', '?')}, at {info.get('at', '?')})"
