"""The Slurm backend: jobs on a Slurm login node (inventory `scheduler: slurm`). extract submits
with sbatch (a job array of one task per shard with `--shards N`), status reads squeue/sacct,
tail/logs read each task's output file, stop is scancel. Only fleetops' own job counts: a Slurm id
that now names another job (reused) is said so, never read as ours (plans/slurm.py Identity). The
same results and progress view as SSH jobs; the node agent's `slurm` op runs the commands
(remote_scripts/jobs/slurm.py) and the answers are parsed here with fleetops/plans/slurm.py."""

from __future__ import annotations

import threading
import time
from functools import partial
from shlex import quote
from typing import TYPE_CHECKING

from ....plans import slurm as sp
from ....plans.jobspec import LogWatch, parse_progress
from ....results import EXIT_FAILED, Item, Next, Result, Status
from ....results.events import (
    ControllerBack,
    ControllerGone,
    JobLine,
    SlurmDetached,
    SlurmState,
    Waiting,
)
from ....results.gpu import AllocationGpus
from ....results.jobs import (
    AlreadyComplete,
    Launched,
    SlurmJobStatus,
    SlurmStopped,
    SlurmTailDetached,
    SlurmTailEnded,
    detached,
    launched,
    logs_result,
)
from ....wire.connector import Connector
from .. import common
from . import view as sv
from .record import read_state
from .view import tasks_view

if TYPE_CHECKING:
    from ....plans.host import Host
    from ....plans.jobspec import JobSpec
    from ....state import RunState
    from ...plan import Plan

SIGNALS = {15: "SIGTERM", 9: "SIGKILL", 2: "SIGINT"}


def _scheduler_env(node: Connector) -> dict[str, str]:
    """SLURM_* values of the host's inventory env (SLURM_CONF for a cluster outside /etc/slurm):
    they reach the query commands; the job's whole environment reaches only sbatch."""
    return {k: v for k, v in node.host.env_values if k.startswith("SLURM_")}


# What each call waits for, said when it is quiet for QUIET_S: the node's Slurm commands give up on
# their own (remote_scripts/jobs/slurmquery.py: scontrol ping 10 s, each squeue/sacct/scancel 20 s).
WAITS = {
    "status": (
        "Slurm's answer about the job (scontrol ping, squeue, sacct; each gives up within 20 s)"
    ),
    "cancel": "scancel and Slurm's confirmation that the job left the queue (scontrol ping, "
    "squeue, scancel; each gives up within 20 s)",
    "submit": "sbatch (scontrol ping, squeue, then sbatch; sbatch gives up within 60 s)",
    "tail": "the job's new lines and Slurm's answer about it (scontrol ping, squeue, sacct; each "
    "gives up within 20 s)",
    "logs": (
        "Slurm's answer about the job (scontrol ping, squeue, sacct; each gives up within 20 s)"
    ),
}
QUIET_S = 3.0


def _call(
    node: Connector,
    action: str,
    request: dict,
    timeout: float = 120,
    run: RunState | None = None,
    task: str = "",
    quiet_s: float = QUIET_S,
) -> dict:
    """The node's `slurm` op; with `run`, a call quiet for `quiet_s` says what it waits for (once,
    then every 15 s), so an operator is never left in silence while the scheduler does not
    answer."""
    payload = {"action": action, "scheduler_env": _scheduler_env(node), **request}
    if run is None:
        return node.call("slurm", payload, timeout=timeout)[0]
    done = threading.Event()
    host = node.host.name
    what = WAITS.get(action, f"Slurm ({action})")

    def tell() -> None:
        started = time.monotonic()
        if done.wait(quiet_s):
            return
        while True:
            elapsed = time.monotonic() - started
            note = what if elapsed < 15 else f"{what}; {int(elapsed) // 15 * 15} s so far"
            left = max(0.0, timeout - elapsed)
            run.emit(Waiting(host, task or action, f"{note} on {host}", left))
            if done.wait(1.0):
                return

    watcher = threading.Thread(target=tell, name=f"slurm-wait-{host}", daemon=True)
    watcher.start()
    try:
        return node.call("slurm", payload, timeout=timeout)[0]
    finally:
        done.set()
        watcher.join(timeout=2)


def _shards(plan: Plan) -> int:
    raw = plan.options.get("shards")
    try:
        n = int(raw or 1)
    except (TypeError, ValueError):
        n = 0
    return n


def _preflight(node: Connector, plan: Plan, spec: JobSpec, notes: list[str]) -> Result | None:
    """The playbook's fast checks on the login node's venv (a cluster shares it with the compute
    nodes): a refusal when one fails, unless --force (then a note). No GPU gate: the login node has
    no GPUs of the job's, and Slurm hands the job free ones (--gres)."""
    assert plan.playbook is not None
    checked, _ = node.call("preflight", common.preflight_request(plan.playbook, spec), timeout=600)
    verify = common.judged_checks(checked.get("verify", {}), plan.playbook.allow_prereleases)
    bad = [c for c in verify.get("items", []) if not c["ok"]]
    if not bad:
        return None
    reasons = "; ".join(f"check {c['name']} [{c['kind']}]: {c['msg']}" for c in bad)
    if plan.options.get("force"):
        notes.append(f"--force: submitted despite: {reasons}")
        return None
    return Result(
        node.host.name,
        "extract",
        Status.FAILED,
        f"refused to submit {spec.name}: {reasons} (--force overrides)",
        [Item(f"check {c['name']} [{c['kind']}]", Status.FAILED, c["msg"]) for c in bad],
        code=EXIT_FAILED,
    )


def _not_submitted(host: str, name: str, answer: dict) -> Result | None:
    """The submit's answer when it launched nothing: a drained node, an error, nothing to do."""
    if answer.get("error_kind") == "drained":
        drain = (answer.get("details") or {}).get("drain") or {}
        return common.drained(host, "extract", drain, f"submit {name}")
    if not answer.get("ok"):
        return common.agent_error(host, "extract", answer, with_kind=True)
    if answer.get("complete"):
        return _nothing_to_do(host, name, answer)
    return None


def _submitted(host: Host, job: dict, sid: str, shards: int, notes: list[str]) -> Result:
    """The job in Slurm's queue: its ids, where it runs, its logs, and sbatch's options."""
    what = f"a job array of {shards} tasks" if shards > 1 else "a batch job"
    items = [Item("note", Status.CHANGED, n) for n in notes]
    # sbatch's options: the words before the batch script and its arguments
    sbatch = job["sbatch_argv"]
    script = next((i for i, a in enumerate(sbatch) if a.endswith("/batch.py")), len(sbatch))
    items.append(Item("sbatch", Status.CHANGED, " ".join(sbatch[1:script])))
    where = ""
    if host.partition:
        where += f", partition {host.partition}"
    if host.gres:
        where += f", gres {host.gres}"
    return launched(
        host.name,
        f"submitted job {job['id']} to Slurm as {what} (Slurm job {sid}{where}); "
        f"logs {', '.join(job['logs'])}",
        items,
        Launched(job, slurm_job_id=sid, shards=shards),
    )


def run_extract(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host
    shards = _shards(plan)
    if shards < 1:
        return Result(
            host.name,
            "extract",
            Status.FAILED,
            f"--shards {plan.options.get('shards')!r}: give a number of shards from 1 to 1000",
            code=EXIT_FAILED,
        )
    spec = common.launch_spec(plan, node)
    assert plan.playbook is not None
    notes = list(spec.notes)
    if spec.preflight:
        refused = _preflight(node, plan, spec, notes)
        if refused is not None:
            return refused
    opts = {
        "partition": host.partition,
        "account": host.account,
        "gres": host.gres,
        "time_limit": host.time_limit,
        "shards": shards,
    }
    answer = _call(
        node,
        "submit",
        {**common.start_request(spec, plan.playbook), "slurm": opts},
        timeout=300,
        run=run,
        task="extract",
    )
    not_submitted = _not_submitted(host.name, spec.name, answer)
    if not_submitted is not None:
        return not_submitted
    job = answer["job"]
    # this run's `tail` shows it from its first line
    run.job_launched(host.name, job["id"], "submitted to Slurm")
    try:
        sid = sp.parse_sbatch(answer["sbatch"]["stdout"])
    except sp.SlurmParseError as exc:
        return Result(
            host.name,
            "extract",
            Status.FAILED,
            f"{exc}; job {job['id']} may have been submitted: check squeue on {host.name}",
            code=EXIT_FAILED,
        )
    return _submitted(host, job, sid, shards, notes)


def _nothing_to_do(host: str, name: str, answer: dict) -> Result:
    """Every task's output already holds all its samples: no job is submitted (it would load the
    model only to write nothing)."""
    done, shards = answer["complete"], int(answer.get("shards") or 1)
    what = f"all {shards} shards complete" if shards > 1 else "its output is complete"
    outputs = ", ".join(f"{d['output']} ({d['done']}/{d['total']})" for d in done)
    return Result(
        host,
        "extract",
        Status.OK,
        f"{name}: nothing to do: {what} ({outputs}); nothing submitted to "
        "Slurm (--again redoes it)",
        payload=AlreadyComplete(done, shards=shards),
    )


def _row(job: dict, r: dict, progress: str | None) -> list[str]:
    label = job["id"] + (f"[{r['task']}]" if int(job.get("shards") or 1) > 1 else "")
    reason = r.get("reason")  # squeue says `None` when it has no reason to give
    state = r["state"] + (
        f" ({reason})" if r["state"] == "pending" and reason not in (None, "", "None") else ""
    )
    return [
        label,
        f"{r.get('slurm_id') or '-'}",
        state,
        sv.exit_text(r),
        r.get("node") or "-",
        r.get("elapsed") or "-",
        progress or "-",
    ]


def run_status(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = common.job_spec(plan, node)
    watch = LogWatch.of(spec)
    pattern = watch.progress.pattern
    answer = _call(
        node,
        "status",
        {"job_id": plan.options.get("job_id"), "progress_pattern": pattern},
        run=run,
        task="status",
    )
    if answer.get("error"):
        return common.agent_error(host, "status", answer, with_kind=True)
    job = answer["job"]
    # loading the job's own playbook registers its secrets: its progress is masked
    common.own_secrets(run, node, job)
    rows = tasks_view(answer)
    word = sp.overall([r["state"] for r in rows])
    code = sv.code(rows, job)
    last = answer.get("last_progress") or []
    parsed = [parse_progress(line, watch.progress) if line else None for line in last]
    table = [
        _row(job, r, common.bar(p) if p else None)
        for r, p in zip(rows, parsed + [None] * len(rows))
    ]
    nodes = sorted({r["node"] for r in rows if r.get("node")})
    msg = _status_msg(job, rows, nodes)
    status = Status.FAILED if code else Status.OK
    nxt = _status_next(host, job, rows, word)
    return Result(
        host,
        "status",
        status,
        msg,
        code=code,
        payload=SlurmJobStatus(
            job,
            word,
            rows[0]["controller"] if rows else "",
            nxt,
            job.get("cancelled_by"),
            "slurm",
            rows,
            nodes,
            last,
            bool(rows and rows[0].get("reused")),
            {
                "title": f"{host}: Slurm job",
                "columns": ["job", "slurm id", "state", "exit", "node", "elapsed", "last progress"],
                "rows": table,
            },
        ),
    )


def _status_msg(job: dict, rows: list[dict], nodes: list[str]) -> str:
    """The job's state in Slurm's words, where it runs, its tasks' counts, a reused id."""
    msg = f"job {job['id']} (Slurm job {job.get('slurm_job_id')}): {sv.describe(rows, job)}"
    if nodes:
        msg += f"; on node {', '.join(nodes)}"
    if len(rows) > 1:
        msg += f"; {sv.counts(rows)}"
    if rows and rows[0].get("reused"):
        msg += f". {rows[0]['reused']}"
    return msg


def _status_next(host: str, job: dict, rows: list[dict], word: str) -> Next | None:
    if rows and rows[0].get("controller") and word in ("unknown", "running", "pending"):
        return Next(
            "Slurm's controller does not answer: nothing about the job can be told (it may still "
            "run); ask the cluster's admins, then look again",
            [f"fab -H {quote(host)} status --job-id {quote(job['id'])}"],
        )
    if not sv.verdict(rows, job).ok:
        return Next(
            "read why it ended",
            [f"fab -H {quote(host)} logs --job-id {quote(job['id'])} --lines 200"],
        )
    return None


def _label(host: str, task: int, shards: int) -> str:
    return f"{host}[{task}]" if shards > 1 else host


def run_tail(
    run: RunState, plan: Plan, node: Connector, follow: common.TailFollower | None = None
) -> Result:
    host = node.host.name
    # attaching: the node starts each task at its last N lines, or at byte 0
    offsets: list[int] | None = None
    attach = common.tail_attach(run, plan, node)
    if isinstance(attach, Result):
        return attach
    watch, job_id, last_lines, from_start, secrets = attach
    # Ctrl-C closes the link on purpose: not a lost connection
    link = common.Reconnect(run.interrupted)
    last_progress: dict[int, dict] = {}
    seen_states: list[str] = []
    blind = False  # Slurm's controller could not be asked at the last poll
    while True:
        if run.interrupted.is_set():
            return _detached(run, host, job_id, offsets)
        position = {"job_id": job_id, "offsets": offsets}
        request = {**common.tail_request(position, (last_lines, from_start)), "mask": secrets}
        answer = link.poll(
            partial(
                _call,
                node,
                "tail",
                request,
                timeout=common.TAIL_WAIT_S + 90,
                run=run,
                task="tail",
                quiet_s=common.TAIL_WAIT_S + QUIET_S,
            ),
            node,
            run.say,
            position,
        )
        if not isinstance(answer, dict):  # None: asked again after a wait; a Result: the tail's end
            if answer is None:
                continue
            return answer
        job = answer["job"]
        job_id = job["id"]
        more = _more_secrets(run, node, job, secrets) if offsets is None else []
        # the job's own playbook has secrets this run's does not: asked again, masked by the node
        if more:
            secrets += more
            continue
        shards = int(job.get("shards") or 1)
        rows = tasks_view(answer)
        word = sp.overall([r["state"] for r in rows])
        _track_state(run, host, job, rows, word, seen_states)
        if follow is not None:
            follow.attached(job_id)
        _show_output(
            run,
            watch,
            host,
            job_id,
            shards,
            answer,
            attached=offsets is None,
            last_progress=last_progress,
            follow=follow,
        )
        offsets = answer["next_offsets"]
        blind = _controller_gone(run, host, rows, answer, blind)
        if blind:
            # the job may still be writing: its log is followed until Slurm can say how it ended
            continue
        if word not in ("running", "pending") and not any(answer["data"]):
            code = sv.code(rows, job)
            end = sv.describe(rows, job)
            return common.tail_ended(
                run,
                host,
                job_id,
                end,
                code,
                last_progress.values(),
                SlurmTailEnded(
                    job_id,
                    word,
                    rows,
                    seen_states,
                    offsets,
                    watch.failures[:20],
                    {t: common.bar(p) for t, p in last_progress.items()},
                ),
            )


def _detached(run: RunState, host: str, job_id: str | None, offsets: list[int] | None) -> Result:
    """Ctrl-C while following: the job keeps running in Slurm."""
    run.emit(SlurmDetached(host, job_id))
    return detached(
        host, f"detached; job {job_id} still in Slurm", SlurmTailDetached(job_id, offsets)
    )


def _more_secrets(run: RunState, node: Connector, job: dict, secrets: list[str]) -> list[str]:
    """The secrets of the job's own playbook that this run's does not mask yet."""
    return [v for v in common.own_secrets(run, node, job) if v not in secrets]


def _track_state(
    run: RunState, host: str, job: dict, rows: list[dict], word: str, seen_states: list[str]
) -> None:
    """Each state the job passes through, recorded and said once."""
    if seen_states and seen_states[-1] == word:
        return
    seen_states.append(word)
    _note_state(run, host, job, rows, word)


def _controller_gone(run: RunState, host: str, rows: list[dict], answer: dict, was: bool) -> bool:
    """Whether to go on following while Slurm's controller cannot be asked: yes until every task has
    written its exit record (then the job is over, and the tail ends as `status` would say). Said
    once when it goes away, once when it answers again."""
    problem = rows[0].get("controller") if rows else ""
    ended = len(answer.get("exits") or {}) >= len(rows)
    if problem and not ended:
        if not was:
            run.emit(ControllerGone(host, problem))
        return True
    if was and not problem:
        run.emit(ControllerBack(host))
    return False


def _note_state(run: RunState, host: str, job: dict, rows: list[dict], word: str) -> None:
    """A job that became pending or running says so once, with the nodes it runs on."""
    if word in ("pending", "running"):
        where = sorted({r["node"] for r in rows if r.get("node")})
        nodes = tuple(where) if word == "running" else ()
        run.emit(SlurmState(host, job.get("slurm_job_id"), sv.describe(rows, job), nodes))


def _show_output(
    run: RunState,
    watch: LogWatch,
    host: str,
    job_id: str,
    shards: int,
    answer: dict,
    *,
    attached: bool,
    last_progress: dict[int, dict],
    follow: common.TailFollower | None = None,
) -> None:
    """One tail answer's lines, per task; on attaching, the bytes each task skipped are said
    first."""
    if attached:
        for task, skip in enumerate(answer.get("skipped") or []):
            if skip.get("skipped_bytes"):
                run.emit(common.skipped(_label(host, task, shards), job_id, skip))
    for task, data in enumerate(answer["data"]):
        for line in data.splitlines():
            failed, progress = watch.read(line)
            if progress:
                last_progress[task] = progress
            run.emit(JobLine(_label(host, task, shards), line, failed, progress))
            if follow is not None:
                follow.line(progress)


def run_logs(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    request, watch = common.logs_request(plan, node)
    answer = _call(node, "logs", request, run=run, task="logs")
    if answer.get("error"):
        return common.agent_error(host, "logs", answer)
    more = [v for v in common.own_secrets(run, node, answer["job"]) if v not in request["mask"]]
    # the job's own playbook has secrets this run's does not: asked again, masked by the node
    if more:
        answer = _call(
            node,
            "logs",
            {**request, "job_id": answer["job"]["id"], "mask": request["mask"] + more},
            run=run,
            task="logs",
        )
        if answer.get("error"):
            return common.agent_error(host, "logs", answer)
    job = answer["job"]
    shards = int(job.get("shards") or 1)
    for task, lines in enumerate(answer["lines"]):
        common.print_lines(run, _label(host, task, shards), lines, watch)
    word = sp.overall([r["state"] for r in tasks_view(answer)])
    count = sum(len(x) for x in answer["lines"])
    return logs_result(host, job["id"], word, count, ", ".join(job["logs"]), answer["lines"])


def _not_cancelled(host: str, what: str, job: dict, rows: list, word: str, problem: str) -> Result:
    """The controller did not answer: the job was not cancelled and may still run."""
    return Result(
        host,
        "stop",
        Status.FAILED,
        f"{what} was NOT cancelled: {problem}; it may still be running",
        code=EXIT_FAILED,
        payload=SlurmStopped(
            job["id"],
            rows,
            word,
            controller=problem,
            next=Next(
                "Slurm's controller does not answer: bring it back (the cluster's "
                "admins), then stop again",
                [f"fab -H {quote(host)} stop --job-id {quote(job['id'])}"],
            ),
        ),
    )


def _not_queued(host: str, what: str, job: dict, rows: list, word: str) -> Result:
    """Nothing in the queue to cancel (the job ended, or its Slurm job id was reused)."""
    reused = ""
    if rows and rows[0].get("reused"):
        reused = f"; {rows[0]['reused']}"
    return Result(
        host,
        "stop",
        Status.OK,
        f"{what} is not in the queue ({sv.describe(rows, job)}); nothing to cancel{reused}",
        payload=SlurmStopped(job["id"], rows, word, reused=bool(reused)),
    )


_ENDED = ("cancelled", "succeeded", "failed", "killed")


def _scancel_item(scancel: dict) -> Item:
    said = f"{' '.join(scancel.get('argv') or ['scancel'])} exit {scancel.get('rc')}"
    if scancel.get("stderr"):
        said += f": {scancel.get('stderr', '').strip()}"
    status = Status.CHANGED if scancel.get("rc") == 0 else Status.FAILED
    return Item("scancel", status, said)


def _task_item(r: dict, left: list) -> Item:
    said = f"{r['slurm_state'] or r['state']}"
    if r.get("node"):
        said += f" on {r['node']}"
    return Item(f"task {r['task']}", Status.FAILED if r in left else Status.OK, said)


def _unconfirmed(host: str, job: dict, rows: list, left: list, scancel: dict) -> str:
    """Why the cancel is not confirmed: the tasks still running, the controller's words."""
    msg = f"scancel {job.get('slurm_job_id')} (exit {scancel.get('rc')}) is not confirmed: "
    msg += ", ".join(f"task {r['task']} {r['state']}" for r in left)
    if rows and rows[0].get("controller"):
        msg += f"; {rows[0]['controller']}"
    return msg + f"; check squeue on {host}"


def _cancelled(host: str, what: str, answer: dict, rows: list, word: str) -> Result:
    """scancel ran: confirmed when it exited 0 and no task is left running."""
    job = answer["job"]
    scancel = answer.get("scancel") or {}
    left = [r for r in rows if r["state"] not in _ENDED]
    ok = scancel.get("rc") == 0 and not left
    items = [_scancel_item(scancel)] + [_task_item(r, left) for r in rows]
    if ok:
        said = ", ".join(sorted({r["slurm_state"] or r["state"] for r in rows}))
        msg = f"cancelled {what} with scancel: Slurm says {said}"
    else:
        msg = _unconfirmed(host, job, rows, left, scancel)
    return Result(
        host,
        "stop",
        Status.CHANGED if ok else Status.FAILED,
        msg,
        items,
        code=0 if ok else EXIT_FAILED,
        payload=SlurmStopped(job["id"], rows, word),
    )


def run_stop(run: RunState, plan: Plan, node: Connector) -> Result:
    """scancel fleetops' own job, confirmed by the job's state in squeue afterwards. A controller
    that cannot be reached fails loudly: the job was not cancelled and may still run."""
    host = node.host.name
    answer = _call(
        node,
        "cancel",
        {"job_id": plan.options.get("job_id"), "grace_s": float(plan.options.get("grace") or 10)},
        timeout=300,
        run=run,
        task="stop",
    )
    if answer.get("error"):
        return common.agent_error(host, "stop", answer)
    job = answer["job"]
    rows = tasks_view(answer)
    word = sp.overall([r["state"] for r in rows])
    what = f"job {job['id']} (Slurm job {job.get('slurm_job_id')})"
    problem = sv.controller_problem(answer.get("before") or {})
    if problem:
        return _not_cancelled(host, what, job, rows, word, problem)
    if not answer.get("changed"):
        return _not_queued(host, what, job, rows, word)
    return _cancelled(host, what, answer, rows, word)


def allocation_note(node: Connector) -> Item | None:
    """For gpu/diagnose on a login node: where fleetops' latest job runs (its allocation's node), or
    None."""
    answer = _call(node, "allocation", {})
    if answer.get("error"):
        return None
    rows = tasks_view(answer)
    nodes = sorted({r["node"] for r in rows if r.get("node")})
    job = answer["job"]
    word = sp.overall([r["state"] for r in rows])
    problem = rows[0]["controller"] if rows else ""
    return Item(
        "Slurm allocation",
        Status.FAILED if problem else Status.OK,
        (
            f"job {job['id']} (Slurm job {job.get('slurm_job_id')}) "
            f"{sv.describe(rows, job) if problem else word}"
        )
        + (f" on node {', '.join(nodes)}" if nodes else ""),
        details={"nodes": nodes, "tasks": rows, "controller": problem},
    )


def run_gpu(run: RunState, plan: Plan, node: Connector) -> Result:
    """`gpu` on a Slurm login node: the GPUs of fleetops' running job's allocation, read on its node
    by the agent run inside the job (srun --overlap), judged by the same gate as `gpu` on an SSH
    node."""
    from dataclasses import replace

    from ....plans.gpugate import evaluate
    from ....plans.tables import GPU_COLUMNS, gpu_rows

    host = node.host.name
    answer = _call(node, "gpu", {})
    if answer.get("error"):
        return common.agent_error(host, "gpu", answer, with_kind=True)
    job = answer["job"]
    rows = tasks_view(answer)
    where = f"job {job['id']} (Slurm job {job.get('slurm_job_id')})"
    if answer.get("inside") is None:
        srun = answer.get("srun")
        if srun is None:
            said = sv.describe(rows, job)
            return Result(
                host,
                "gpu",
                Status.FAILED if rows and rows[0].get("controller") else Status.OK,
                f"login node of a Slurm cluster: {where} is "
                f"{said}; {answer['why']} (GPUs are Slurm's to "
                "allocate)",
                payload=AllocationGpus(rows),
                code=EXIT_FAILED if rows and rows[0].get("controller") else 0,
            )
        return Result(
            host,
            "gpu",
            Status.FAILED,
            f"could not look into {where}'s allocation on "
            f"{answer.get('node')}: srun exit {srun['rc']}: {srun['stderr'].strip()[-300:]}",
            code=EXIT_FAILED,
            payload=AllocationGpus(rows),
        )
    inside = answer["inside"]
    if not inside.get("ok"):
        return Result(
            host,
            "gpu",
            Status.FAILED,
            f"{where} on node {answer['node']}: {inside.get('error')}",
            code=EXIT_FAILED,
            payload=AllocationGpus(rows, inside.get("error_kind")),
        )
    verdict = evaluate(inside, replace(plan.options["gate"], expected=None))
    return Result(
        host,
        "gpu",
        Status.OK if verdict.code == 0 else Status.FAILED,
        f"{verdict.word}: allocation of {where} on node {answer['node']} (read inside the job "
        f"with srun --overlap): {verdict.msg}",
        verdict.items,
        code=verdict.code,
        payload=AllocationGpus(
            rows,
            node=answer["node"],
            task_job_id=answer["task_job_id"],
            srun_argv=answer["srun"]["argv"],
            gpus=inside.get("gpus", []),
            verdict=verdict.word,
            table={
                "title": f"{host}: GPUs of Slurm job {answer['task_job_id']} on {answer['node']}",
                "columns": GPU_COLUMNS,
                "rows": gpu_rows(verdict),
            },
        ),
    )


class SlurmJobs(common.TaskBackend):
    """A Slurm login node (inventory `scheduler: slurm`): sbatch, squeue/sacct, the tasks' output
    files, scancel; --shards N is a job array on the one host, and the job's GPUs are its
    allocation's."""

    scheduler = "slurm"
    shards_by_host = False
    allocates = True
    host_words = "a Slurm login node"
    tasks = common.BackendTasks(run_extract, run_status, run_tail, run_logs, run_stop)

    def read_record(self, job: dict, now_ts: object) -> dict:
        if not isinstance(job.get("record"), dict):
            return job
        return {**job, **read_state(job["record"], job.get("query"), job.get("exits"), now_ts)}

    def who(self, job: dict) -> str:
        return f"Slurm job {job.get('slurm_job_id')}"

    def allocation_gpus(self, run: RunState, plan: Plan, node: Connector) -> Result | None:
        return run_gpu(run, plan, node)

    def allocation_note(self, node: Connector) -> Item | None:
        return allocation_note(node)


SLURM = common.register(SlurmJobs())
