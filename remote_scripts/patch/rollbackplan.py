"""Rollback's plan for one file of a set: the original computed by reversing the hunks the client
sent and proven against pip's RECORD sha256 where RECORD lists the file; the saved backup only as a
witness, or as the source for `--force` on a drifted file when its bytes are the wheel's. Loaded by
a rollback only. Stdlib only.
"""

from __future__ import annotations

from ..core.nodeio import sha256_bytes
from ..core.protocol import ALREADY_ORIGINAL, DRIFTED, FAILED
from .backups import backup_paths, bad_backup, read_backup, read_record
from .hunks import apply_hunks, classify, closest_window, first_difference
from .setfile import SetFile, unified, written_by
from .sitelock import SiteLock, site_root_of
from .wheelrecord import record_sha256


class _Evidence:
    """What can prove an original for one file: its sha256, fleetops' record and saved backup of
    it, and the wheel's RECORD entry."""

    def __init__(self, req: dict, f: SetFile, site: SiteLock | None) -> None:
        self.sha = sha256_bytes(f.data)
        self.record = read_record(req.get("state_dir"), f.path)
        self.orig_path = backup_paths(req["state_dir"], f.path)[1] if req.get("state_dir") else ""
        self.wheel_sha, self.wheel_record = record_sha256(site_root_of(f.path), f.path)
        self.wrote_patched = _wrote_patched(site, f.path, self.sha, self.record)
        self.backup: tuple[bytes, str, dict] | None = None

    def edited_after_patch(self) -> bool:
        """fleetops patched this file, and these bytes are not the ones it wrote."""
        return not self.wrote_patched and bool(self.record and self.record.get("patched_sha256"))


def _wrote_patched(site: SiteLock | None, path: str, sha: str, record: dict | None) -> bool:
    """Whether these bytes are the patched file fleetops wrote (its record or the site's log)."""
    if record and record.get("patched_sha256") == sha:
        return True
    return bool(written_by(site, path, sha, "patched"))


def plan_rollback(req: dict, f: SetFile, site: SiteLock | None) -> None:
    cls = classify(f.lines, f.hunks)
    ev = _Evidence(req, f, site)
    overall = cls["overall"]
    if overall == "pristine" and cls["both"] and ev.wrote_patched:
        # the tie (see hunks.classify): this is the file fleetops wrote; reverse it
        overall, cls = "patched", _tie_as_patched(cls)
    if overall == "pristine":
        wheels = ev.wheel_sha == ev.sha
        _rollback_pristine(f, site, ev.sha, ev.record, wheels, ev.wheel_record)
        return
    ev.backup = read_backup(ev.orig_path, ev.record)
    if overall == "patched":
        _rollback_patched(f, cls, ev)
    else:
        _rollback_drifted(req, f, cls, ev)


def _tie_as_patched(cls: dict) -> dict:
    """The classification read the other way: every hunk patched, at the place its reverse fits."""
    hunks = [
        {**s, "state": "patched", "at_old": None, "at_new": at}
        for s, at in zip(cls["hunks"], cls["reverse_at"])
    ]
    return {**cls, "hunks": hunks}


def _rollback_patched(f: SetFile, cls: dict, ev: _Evidence) -> None:
    """Every hunk has its patched form: plan the hunks reversed (or the proven saved original)."""
    reversed_bytes = apply_hunks(f.lines, f.hunks, cls, reverse=True).encode("utf-8")
    rsha = sha256_bytes(reversed_bytes)
    # the bytes an untouched rollback must give
    proof = ev.wheel_sha or (rsha if ev.wrote_patched else None)
    bad = bad_backup(ev.backup, ev.orig_path, proof, ev.wheel_record)
    if bad:
        f.refuse(
            FAILED,
            bad + f"; refusing to restore it; {f.path} is unchanged. The hunks alone can roll it "
            f"back: move {ev.orig_path} and its .json aside and run rollback again",
        )
        return
    new, what = _restore_choice(ev, reversed_bytes, rsha, len(f.hunks))
    f.new = new
    f.item["diff_text"] = unified(f.data.decode("utf-8"), new.decode("utf-8"), f.path)
    f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"


def _restore_choice(ev: _Evidence, reversed_bytes: bytes, rsha: str, n: int) -> tuple[bytes, str]:
    """The bytes a rollback of a patched file restores, and what proves them (for the messages)."""
    backup, wheel_sha = ev.backup, ev.wheel_sha
    if wheel_sha and rsha == wheel_sha:
        if backup:
            return reversed_bytes, (
                f"the saved original (sha256 {rsha[:12]} verified: the hunks reversed, the "
                "saved backup and the wheel's RECORD agree)"
            )
        return reversed_bytes, (
            f"the original by reversing the {n} hunks (sha256 {rsha[:12]} verified "
            "against the wheel's RECORD)"
        )
    if ev.edited_after_patch():
        return reversed_bytes, (
            f"the original by reversing the {n} hunks; edits made after the patch, outside "
            "the hunks, are kept (the file was not the one fleetops wrote)"
        )
    if wheel_sha and backup and backup[1] == wheel_sha:
        # exactly the file fleetops wrote, yet the hunks reversed do not give the wheel's bytes
        # (hunks placed ambiguously): the saved original, proven by RECORD, is the answer.
        return backup[0], (
            f"the saved original (sha256 {wheel_sha[:12]} verified against the wheel's RECORD)"
        )
    if wheel_sha:
        return reversed_bytes, (
            f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; not the wheel's "
            f"RECORD sha256 {wheel_sha[:12]}: the file was edited before or after the patch, "
            "outside the hunks; kept)"
        )
    agrees = ", the saved backup agrees" if backup and backup[1] == rsha else ""
    return reversed_bytes, (
        f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; the file is not "
        f"in any RECORD{agrees})"
    )


def _rollback_drifted(req: dict, f: SetFile, cls: dict, ev: _Evidence) -> None:
    """The patched form is not all there: refuse, or with `--force` restore the saved original
    where the wheel's RECORD proves it."""
    drift = _rollback_drift(f.lines, f.hunks, cls)
    refusal = _drifted_refusal(req, f, ev)
    if refusal:
        f.refuse(refusal[0], refusal[1], drift=drift)
        return
    # _drifted_refusal refuses without a RECORD or a proven backup
    assert ev.backup is not None and ev.wheel_sha is not None
    f.new = ev.backup[0]
    f.item["diff_text"] = unified(f.data.decode("utf-8"), f.new.decode("utf-8", "replace"), f.path)
    what = (
        f"the saved original over a drifted file (--force; sha256 {ev.wheel_sha[:12]} verified "
        "against the wheel's RECORD): every change since the patch is gone (the diff shows them)"
    )
    f.item["drift"] = drift
    f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"


def _drifted_refusal(req: dict, f: SetFile, ev: _Evidence) -> tuple[str, str] | None:
    """Why a drifted file is not restored (status and message), or None to restore it."""
    if not req.get("force"):
        return DRIFTED, (
            f"drifted: {f.path} has neither the patched nor the pristine form of every hunk "
            "(edited after the patch?); nothing written. `rollback --force` restores the "
            "original (proven against the wheel's RECORD), discarding every change in the file"
        )
    if not ev.wheel_sha:
        return DRIFTED, (
            f"drifted, and --force cannot prove an original: no RECORD lists {f.path}, so the "
            "saved backup cannot be checked; nothing written"
        )
    bad = bad_backup(ev.backup, ev.orig_path, ev.wheel_sha, ev.wheel_record)
    if bad or not ev.backup:
        return FAILED, (
            (bad or f"drifted, and no saved original on this node ({ev.orig_path})")
            + f"; --force has nothing proven to restore; {f.path} is unchanged. "
            "Reinstall the package to get its files back"
        )
    return None


def _rollback_pristine(
    f: SetFile,
    site: SiteLock | None,
    sha: str,
    record: dict | None,
    wheels: bool,
    wheel_record: str | None,
) -> None:
    """Nothing to roll back: say why (restored earlier, the saved original, or never patched), and
    whether a saved backup of other bytes is being ignored. `wheels`: the file's sha256 is its
    wheel's RECORD's."""
    if written_by(site, f.path, sha, "pristine"):
        restored_by = written_by(site, f.path, sha, "pristine").replace(
            " (by ", " (restored by ", 1
        )
        why = f"already original{restored_by}; nothing to do"
    elif record and record.get("original_sha256") == sha:
        why = "already original (sha256 matches the saved original); nothing to do"
    else:
        proof = f"; sha256 {sha[:12]} is the wheel's, per {wheel_record}" if wheels else ""
        n = len(f.hunks)
        why = (
            f"not patched by fleetops; nothing to do (all {n} hunk{'s' * (n != 1)} have their "
            f"pristine form{proof})"
        )
    f.noop(ALREADY_ORIGINAL, why)
    if record and record.get("original_sha256") not in (sha, None):
        f.note(
            f"the saved backup from {record.get('created', '?')} (sha256 "
            f"{str(record.get('original_sha256'))[:12]}) is of other bytes than this file; not used"
        )


def _rollback_drift(lines: list[str], hunks: list[dict], cls: dict) -> list[dict]:
    """Hunk by hunk, where the patched form is not there: the patched lines expected, the lines
    found where the file looks most like them, and the first line that differs."""
    out: list[dict] = []
    for h, s in zip(hunks, cls["hunks"]):
        if s["state"] == "patched":
            continue
        item = {"hunk": s["index"] + 1, "header": h["header"], "state": s["state"]}
        if s["state"] == "pristine":
            item["message"] = (
                f"hunk {s['index'] + 1} still has its pristine "
                "form: the file is only partly patched"
            )
        else:
            block = h["new"]
            p = closest_window(lines, block, s["expected"])
            found = [
                x[:-1].removesuffix("\r") if x.endswith("\n") else x
                for x in lines[p : p + len(block)]
            ]
            k = first_difference(block, found)
            item.update({"near_line": p + 1, "expected": block, "found": found})
            if k is not None:
                item["first_difference"] = {
                    "line": p + k + 1,
                    "expected": block[k],
                    "found": found[k] if k < len(found) else "<end of file>",
                }
        out.append(item)
    return out
