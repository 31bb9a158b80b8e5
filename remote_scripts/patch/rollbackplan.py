"""Rollback's plan for one file of a set: the original computed by reversing the hunks the client
sent and proven against pip's RECORD sha256 where RECORD lists the file; the saved backup only as a
witness, or as the source for `--force` on a drifted file when its bytes are the wheel's. Loaded by
a rollback only. Stdlib only.
"""

from __future__ import annotations

from ..core.nodeio import sha256_bytes
from ..core.protocol import ALREADY_ORIGINAL, DRIFTED, FAILED
from .backups import backup_paths, bad_backup, read_backup, read_record
from .hunks import apply_hunks, classify, closest_window
from .setfile import SetFile, unified, written_by
from .sitelock import SiteLock, site_root_of
from .wheelrecord import record_sha256


def plan_rollback(req: dict, f: SetFile, site: SiteLock | None) -> None:
    hunks, n = f.hunks, len(f.hunks)
    cls = classify(f.lines, hunks)
    sha = sha256_bytes(f.data)
    record = read_record(req.get("state_dir"), f.path)
    _, orig_path = backup_paths(req["state_dir"], f.path) if req.get("state_dir") else ("", "")
    wheel_sha, wheel_record = record_sha256(site_root_of(f.path), f.path)
    wrote_patched = bool(record and record.get("patched_sha256") == sha) or bool(
        written_by(site, f.path, sha, "patched")
    )
    overall = cls["overall"]
    if overall == "pristine" and cls["both"] and wrote_patched:
        # the tie (see hunks.classify): this is the file fleetops wrote; reverse it
        overall = "patched"
        cls = {
            **cls,
            "hunks": [
                {**s, "state": "patched", "at_old": None, "at_new": at}
                for s, at in zip(cls["hunks"], cls["reverse_at"])
            ],
        }
    if overall == "pristine":
        _rollback_pristine(f, site, sha, record, wheel_sha == sha, wheel_record)
        return
    backup = read_backup(orig_path, record)
    if overall == "patched":
        reversed_text = apply_hunks(f.lines, hunks, cls, reverse=True)
        new = reversed_text.encode("utf-8")
        rsha = sha256_bytes(new)
        # the bytes an untouched rollback must give
        proof = wheel_sha or (rsha if wrote_patched else None)
        bad = bad_backup(backup, orig_path, proof, wheel_record)
        if bad:
            f.refuse(
                FAILED,
                bad
                + f"; refusing to restore it; {f.path} is unchanged. The hunks alone can roll it "
                f"back: move {orig_path} and its .json aside and run rollback again",
            )
            return
        if wheel_sha and rsha == wheel_sha:
            if backup:
                what = (
                    f"the saved original (sha256 {rsha[:12]} verified: the hunks reversed, the "
                    "saved backup and the wheel's RECORD agree)"
                )
            else:
                what = (
                    f"the original by reversing the {n} hunks (sha256 {rsha[:12]} verified "
                    "against the wheel's RECORD)"
                )
        elif not wrote_patched and record and record.get("patched_sha256"):
            what = (
                f"the original by reversing the {n} hunks; edits made after the patch, outside "
                "the hunks, are kept (the file was not the one fleetops wrote)"
            )
        elif wheel_sha and backup and backup[1] == wheel_sha:
            # exactly the file fleetops wrote, yet the hunks reversed do not give the wheel's bytes
            # (hunks placed ambiguously): the saved original, proven by RECORD, is the answer.
            new, rsha = backup[0], backup[1]
            what = f"the saved original (sha256 {rsha[:12]} verified against the wheel's RECORD)"
        elif wheel_sha:
            what = (
                f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; not the wheel's "
                f"RECORD sha256 {wheel_sha[:12]}: the file was edited before or after the patch, "
                "outside the hunks; kept)"
            )
        else:
            what = (
                f"the original by reversing the {n} hunks (sha256 {rsha[:12]}; the file is not "
                "in any RECORD"
                f"{', the saved backup agrees' if backup and backup[1] == rsha else ''})"
            )
        f.new = new
        f.item["diff_text"] = unified(f.data.decode("utf-8"), new.decode("utf-8"), f.path)
        f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"
        return
    # drifted: the patched form is not all there
    drift = _rollback_drift(f.lines, hunks, cls)
    if not req.get("force"):
        f.refuse(
            DRIFTED,
            f"drifted: {f.path} has neither the patched nor the pristine form of every hunk "
            "(edited after the patch?); nothing written. `rollback --force` restores the "
            "original (proven against the wheel's RECORD), discarding every change in the file",
            drift=drift,
        )
        return
    if not wheel_sha:
        f.refuse(
            DRIFTED,
            f"drifted, and --force cannot prove an original: no RECORD lists {f.path}, so the "
            "saved backup cannot be checked; nothing written",
            drift=drift,
        )
        return
    bad = bad_backup(backup, orig_path, wheel_sha, wheel_record)
    if bad or not backup:
        f.refuse(
            FAILED,
            (bad or f"drifted, and no saved original on this node ({orig_path})") + "; --force has "
            f"nothing proven to restore; {f.path} is unchanged. "
            "Reinstall the package to get its files back",
            drift=drift,
        )
        return
    f.new = backup[0]
    f.item["diff_text"] = unified(f.data.decode("utf-8"), f.new.decode("utf-8", "replace"), f.path)
    what = (
        f"the saved original over a drifted file (--force; sha256 {wheel_sha[:12]} verified "
        "against the wheel's RECORD): every change since the patch is gone (the diff shows them)"
    )
    f.item["drift"] = drift
    f.would_msg, f.done_msg = f"would restore {what}", f"restored {what}"


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
            k = next(
                (k for k in range(len(block)) if k >= len(found) or found[k] != block[k]), None
            )
            item.update({"near_line": p + 1, "expected": block, "found": found})
            if k is not None:
                item["first_difference"] = {
                    "line": p + k + 1,
                    "expected": block[k],
                    "found": found[k] if k < len(found) else "<end of file>",
                }
        out.append(item)
    return out
