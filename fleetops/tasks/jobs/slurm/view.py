"""A Slurm job as fleetops reports it, from the node's raw answers (remote_scripts/jobs/slurm.py)
parsed with fleetops/plans/slurm.py: each task's state, the job's words, and the exit status
`status` asks for.

A controller that cannot be reached is never read as "the job is not in the queue": every task is
UNKNOWN and the scheduler's own message is the reason shown. Slurm's words stand: a cancelled job is
"cancelled" (by fleetops' own `stop` when job.json says so), a requeued one says requeued, an array
counts its tasks by state. `status` exits only with the README's statuses: 0 (running, pending,
succeeded, or cancelled by fleetops' `stop`), 1 (failed, cancelled by someone else, killed, or
unknown); the job's own exit status is in the words and in --json."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ....plans import slurm as sp
from ....plans.jobverdict import JobVerdict, job_verdict

UNREACHABLE_WORDS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted or received",
    "did not answer in",
)


def controller_problem(query: dict) -> str:
    """Why Slurm could not be asked about the job ("" when it could): the controller's ping, or
    squeue's own message when squeue failed that way."""
    ping = query.get("controller")
    if ping:
        said = " ".join(
            (ping.get("stdout", "") + " " + ping.get("stderr", "")).replace("*", " ").split()
        )
        return (
            "Slurm's controller cannot be reached (scontrol "
            f"ping exit {ping.get('rc')}: {said[:300]})"
        )
    listed = query.get("squeue")
    if (
        listed
        and listed["rc"] != 0
        and any(w in listed["stderr"].lower() for w in UNREACHABLE_WORDS)
    ):
        return (
            f"Slurm's controller did not answer squeue (exit {listed['rc']}: "
            f"{listed['stderr'].strip()[:300]})"
        )
    return ""


def _sources(
    answer: dict, identity: sp.Identity, notes: list[str], restarts: dict[str, int]
) -> tuple[list[list[sp.TaskState]], list[sp.TaskState]]:
    query = answer.get("query") or {}
    sources: list[list[sp.TaskState]] = []
    others: list[sp.TaskState] = []
    for name, parse in (("squeue", sp.parse_squeue), ("sacct", sp.parse_sacct)):
        raw = query.get(name)
        if not raw:
            continue
        if name == "sacct" and sp.sacct_disabled(raw["stdout"], raw["stderr"]):
            notes.append("sacct: accounting storage is disabled on this cluster")
            continue
        if raw["rc"] != 0:
            if "invalid job id" not in raw["stderr"].lower():
                notes.append(f"{name} (exit {raw['rc']}): {raw['stderr'].strip()[:200]}")
            continue
        try:
            ours, theirs = sp.split_owned(parse(raw["stdout"]), identity, restarts)
        except sp.SlurmParseError as exc:
            notes.append(str(exc))
            continue
        sources.append(ours)
        others += theirs
    return sources, others


def tasks_view(answer: dict) -> list[dict]:
    """Each task's state: squeue (the controller's view, recently ended jobs included), then sacct
    (accounting), fleetops' own job's lines only (its user, name, submit time); then the exit file
    the batch script wrote; 'unknown' when none of them knows it, or when the controller could not
    be asked (`controller` says why). Slurm's state word stands; an exit status is shown only when
    it agrees with it. A line of another job that has the id now is a note on every task
    ("reused")."""
    job = answer["job"]
    shards = int(job.get("shards") or 1)
    query = answer.get("query") or {}
    problem = controller_problem(query)
    notes: list[str] = [problem] if problem else []
    restarts = (
        sp.parse_restarts((query.get("restarts") or {}).get("stdout", ""))
        if (query.get("restarts") or {}).get("rc") == 0
        else {}
    )
    sources, others = _sources(answer, sp.Identity.of(job), notes, restarts)
    reused = reused_note(job, others) if others else ""
    if reused:
        notes.append(reused)
    merged = sp.merge(*sources, tasks=shards)
    exits = answer.get("exits") or {}
    return [
        _row(task, merged[task], exits.get(str(task)), notes, reused, problem, restarts)
        for task in range(shards)
    ]


def _row(
    task: int,
    st: sp.TaskState | None,
    ended: dict | None,
    notes: list[str],
    reused: str,
    problem: str,
    restarts: dict[str, int],
) -> dict:
    row: dict = {
        "task": task,
        "notes": notes,
        "reused": reused,
        "controller": problem,
        "restarts": 0,
    }
    if st is not None:
        row.update(
            state=st.word,
            slurm_state=st.state,
            slurm_id=st.job_id,
            reason=st.reason,
            node=st.nodes,
            exit_code=st.exit_code,
            signal=st.signal,
            source=st.source,
            elapsed=st.elapsed,
            restarts=restarts.get(st.job_id, 0),
        )
    elif ended and (not problem or _clean_end(ended)):
        # The task's own exit record decides. While the controller cannot be asked, only a clean end
        # does: a task's requeue (which Slurm alone would tell) ends its run with a signal, never
        # with exit 0, and its next run removes the record when it starts (slurmstep.py).
        word = (
            "killed"
            if ended.get("signal")
            else "succeeded"
            if ended.get("exit_code") == 0
            else "failed"
        )
        row.update(
            state=word,
            slurm_state="",
            slurm_id="",
            reason="",
            node="",
            exit_code=ended.get("exit_code"),
            signal=ended.get("signal"),
            source="exit-file",
            elapsed="",
        )
    else:
        row.update(
            state="unknown",
            slurm_state="",
            slurm_id="",
            reason="",
            node="",
            exit_code=None,
            signal=None,
            source="none",
            elapsed="",
        )
    # squeue has no exit status: the job's own record, if it agrees
    if ended and row["source"] == "squeue":
        _exit_from_file(row, ended)
    if ended and isinstance(ended.get("job_cause"), str) and row["state"] in ("failed", "killed"):
        # the job's own one line (a dataset it could not read, a full disk)
        row["cause"] = ended["job_cause"]
    return row


def _clean_end(ended: dict) -> bool:
    return ended.get("exit_code") == 0 and not ended.get("signal")


def _exit_from_file(row: dict, ended: dict) -> None:
    code, sig = ended.get("exit_code"), ended.get("signal")
    word = row["state"]
    if word in ("pending", "running"):
        return  # a requeued task's earlier run: not this run's end
    if word == "cancelled":
        row["exit_code"], row["signal"] = code, sig or row["signal"]
    elif (
        word == "succeeded"
        and code == 0
        and not sig
        or word == "failed"
        and not (code == 0 and not sig)
    ):
        row["exit_code"], row["signal"] = code, sig
    elif word in ("succeeded", "failed"):
        row["exit_code"] = row["signal"] = None
        row["notes"] = [
            *row["notes"],
            f"task {row['task']}: Slurm says {row['slurm_state']}, the job's exit file "
            f"says exit status {code}{f' (signal {sig})' if sig else ''}; Slurm's word is kept",
        ]


def reused_note(job: dict, others: list[sp.TaskState]) -> str:
    first = others[0]
    return (
        f"Slurm job {job.get('slurm_job_id')} is not fleetops' "
        f"job {job['id']} any more: the id was reused by "
        f"another job (user {first.user or '?'}, name {first.name!r}, submitted "
        f"{first.submit or '?'}, "
        f"{first.state}); fleetops' job is no longer known "
        "to the scheduler, and nothing of the other job is "
        "read, counted or cancelled"
    )


def exit_text(row: dict) -> str:
    if row["state"] in ("running", "pending", "unknown"):
        return "-"
    if row.get("signal"):
        return f"signal {row['signal']}"
    return "-" if row.get("exit_code") is None else str(row["exit_code"])


def code(rows: list[dict], job: dict | None = None) -> int:
    """The exit status `status`/`tail` ask for: one of the README's table (the verdict every job
    reader shares: plans/jobverdict.py)."""
    return verdict(rows, job).code


def verdict(rows: list[dict], job: dict | None = None) -> JobVerdict:
    return job_verdict(
        sp.overall([r["state"] for r in rows]), None, (job or {}).get("cancelled_by")
    )


def counts(rows: list[dict]) -> str:
    """An array's tasks by state: `2 tasks: 1 running, 1 pending` (empty for a single task)."""
    if len(rows) < 2:
        return ""
    by = Counter(r["state"] for r in rows)
    return f"{len(rows)} tasks: " + ", ".join(f"{n} {word}" for word, n in by.items())


def describe(rows: list[dict], job: dict | None = None) -> str:
    word = sp.overall([r["state"] for r in rows])
    if word == "succeeded":
        return "succeeded (exit status 0)"
    if word == "cancelled":
        return _cancelled(rows, job or {})
    told = _TOLD.get(word)
    return told(rows) if told is not None else "running"


def _killed(rows: list[dict]) -> str:
    sig = next((r.get("signal") for r in rows if r.get("signal")), None)
    return f"killed by signal {sig} (its exit file says so; Slurm no longer lists it)"


def _failed_task(r: dict) -> str:
    code = "unknown" if r["exit_code"] is None else r["exit_code"]
    said = f"task {r['task']}: {r['slurm_state'] or 'exit'} exit status {code}"
    if r.get("cause"):
        said += f": {r['cause']}"
    return said


def _failed(rows: list[dict]) -> str:
    return "failed (" + "; ".join(_failed_task(r) for r in rows if r["state"] == "failed") + ")"


def _cancelled(rows: list[dict], job: dict) -> str:
    by = job.get("cancelled_by")
    who = (
        f"by fab stop at {by.get('at')}" if isinstance(by, dict) else "by scancel outside fleetops"
    )
    gone = [r for r in rows if r["state"] == "cancelled"]
    never = all(
        not r.get("node") and r.get("exit_code") is None and not r.get("signal") for r in gone
    )
    sig = next((r.get("signal") for r in gone if r.get("signal")), None)
    return (
        f"cancelled {who}"
        + (" while pending: it never ran" if never else "")
        + (f" (its task got signal {sig})" if sig and not never else "")
    )


def _pending(rows: list[dict]) -> str:
    waiting = [r for r in rows if r["state"] == "pending"]
    reasons = sorted({r["reason"] for r in waiting if r["reason"] and r["reason"] != "None"})
    requeued = [
        r
        for r in waiting
        if r.get("restarts") or str(r.get("slurm_state", "")).startswith("REQUEUE")
    ]
    text = f"pending (waiting for the scheduler: {', '.join(reasons) or 'no reason given'})"
    if requeued:
        times = max(int(r.get("restarts") or 1) for r in requeued)
        text = f"requeued by Slurm ({times} time{'s' if times > 1 else ''}), " + text
    return text


def _unknown(rows: list[dict]) -> str:
    problem = next((r["controller"] for r in rows if r.get("controller")), "")
    if problem:
        return (
            f"UNKNOWN: {problem}; the job may still be running "
            "(nothing is concluded while the controller "
            "does not answer)"
        )
    no_acct = any("accounting storage is disabled" in n for r in rows for n in r.get("notes", []))
    return (
        "unknown: the scheduler no longer lists it"
        + (" (no accounting on this cluster)" if no_acct else "")
        + " and it left no exit file; see its log with fab logs"
    )


# How `describe` words a job by Slurm's overall state (the words that need the job's record, and
# the plain ones, are its own branches).
_TOLD: dict[str, Callable[[list[dict]], str]] = {
    "killed": _killed,
    "failed": _failed,
    "pending": _pending,
    "unknown": _unknown,
}
