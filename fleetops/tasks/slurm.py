"""Jobs on a Slurm login node (inventory `scheduler: slurm`): extract submits with sbatch (a job array of one
task per shard with `--shards N`), status reads squeue/sacct, tail/logs read each task's output file, stop is
scancel. Only fleetops' own job counts: a Slurm id that now names another job (reused) is said so, never read
as ours (plans/slurm.py Identity). The same results and progress view as SSH jobs; the node agent's `slurm` op runs the
commands (remote_scripts/jobs/slurm.py) and the answers are parsed here with fleetops/plans/slurm.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plans import slurm as sp
from ..plans.jobspec import LogWatch, is_failure, parse_progress
from ..plans.tables import bar
from ..plans.versions import judged_checks
from ..results import EXIT_FAILED, Item, Result, Status
from ..wire.connector import Connector, TransportError
from .plan import agent_error, drained, job_spec, preflight_request, skipped_note, tail_start
from .reconnect import TAIL_WAIT_S, Reconnect

if TYPE_CHECKING:
    from ..state import RunState
    from .plan import Plan

SIGNALS = {15: "SIGTERM", 9: "SIGKILL", 2: "SIGINT"}


def _scheduler_env(node: Connector) -> dict[str, str]:
    """SLURM_* values of the host's inventory env (SLURM_CONF for a cluster outside /etc/slurm): they reach the
    query commands; the job's whole environment reaches only sbatch."""
    return {k: v for k, v in node.host.env_values if k.startswith("SLURM_")}


def _call(node: Connector, action: str, request: dict, timeout: float = 120) -> dict:
    answer, _ = node.call("slurm", {"action": action, "scheduler_env": _scheduler_env(node), **request},
                          timeout=timeout)
    return answer


def _shards(plan: Plan) -> int:
    raw = plan.options.get("shards")
    try:
        n = int(raw or 1)
    except (TypeError, ValueError):
        n = 0
    return n


def tasks_view(answer: dict) -> list[dict]:
    """Each task's state: squeue (the controller's view, recently ended jobs included), then sacct (accounting),
    fleetops' own job's lines only (its user, name, submit time); then the exit file the batch script wrote;
    'unknown' when none of them knows it. Slurm's state word stands; an exit status is shown only when it agrees
    with it. A line of another job that has the id now is a note on every task ("reused")."""
    job = answer["job"]
    shards = int(job.get("shards") or 1)
    identity = sp.Identity.of(job)
    query = answer.get("query") or {}
    sources: list[list[sp.TaskState]] = []
    notes: list[str] = []
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
            ours, theirs = sp.split_owned(parse(raw["stdout"]), identity)
        except sp.SlurmParseError as exc:
            notes.append(str(exc))
            continue
        sources.append(ours)
        others += theirs
    reused = reused_note(job, others) if others else ""
    if reused:
        notes.append(reused)
    merged = sp.merge(*sources, tasks=shards)
    exits = answer.get("exits") or {}
    out = []
    for task in range(shards):
        st = merged[task]
        ended = exits.get(str(task))
        row: dict = {"task": task, "notes": notes, "reused": reused}
        if st is not None:
            row.update(state=st.word, slurm_state=st.state, slurm_id=st.job_id, reason=st.reason, node=st.nodes,
                       exit_code=st.exit_code, signal=st.signal, source=st.source, elapsed=st.elapsed)
            if st.word == "killed" and not st.signal:
                row["signal"] = 15
        elif ended:
            word = ("killed" if ended.get("signal") else "succeeded" if ended.get("exit_code") == 0 else "failed")
            row.update(state=word, slurm_state="", slurm_id="", reason="", node="", exit_code=ended.get("exit_code"),
                       signal=ended.get("signal"), source="exit-file", elapsed="")
        else:
            row.update(state="unknown", slurm_state="", slurm_id="", reason="", node="", exit_code=None, signal=None,
                       source="none", elapsed="")
        if ended and row["source"] == "squeue":  # squeue has no exit status: the job's own record, if it agrees
            _exit_from_file(row, ended)
        out.append(row)
    return out


def _exit_from_file(row: dict, ended: dict) -> None:
    code, sig = ended.get("exit_code"), ended.get("signal")
    word = row["state"]
    if word == "killed":
        row["exit_code"], row["signal"] = code, sig or row["signal"]
    elif word == "succeeded" and code == 0 and not sig or word == "failed" and not (code == 0 and not sig):
        row["exit_code"], row["signal"] = code, sig
    elif word in ("succeeded", "failed"):
        row["exit_code"] = row["signal"] = None
        row["notes"] = [*row["notes"], f"task {row['task']}: Slurm says {row['slurm_state']}, the job's exit file "
                        f"says exit status {code}{f' (signal {sig})' if sig else ''}; Slurm's word is kept"]


def reused_note(job: dict, others: list[sp.TaskState]) -> str:
    first = others[0]
    return (f"Slurm job {job.get('slurm_job_id')} is not fleetops' job {job['id']} any more: the id was reused by "
            f"another job (user {first.user or '?'}, name {first.name!r}, submitted {first.submit or '?'}, "
            f"{first.state}); fleetops' job is no longer known to the scheduler, and nothing of the other job is "
            "read, counted or cancelled")


def _exit_text(row: dict) -> str:
    if row["state"] in ("running", "pending", "unknown"):
        return "-"
    if row.get("signal"):
        return f"signal {row['signal']}"
    return str(row.get("exit_code"))


def _code(rows: list[dict]) -> int:
    word = sp.overall([r["state"] for r in rows])
    if word in ("running", "pending", "succeeded"):
        return 0
    for r in rows:
        if r.get("signal"):
            return 128 + int(r["signal"])
    return next((int(r["exit_code"]) for r in rows if r.get("exit_code")), 1)


def _describe(rows: list[dict]) -> str:
    word = sp.overall([r["state"] for r in rows])
    if word == "succeeded":
        return "succeeded (exit status 0)"
    if word == "killed":
        sig = next((r.get("signal") for r in rows if r.get("signal")), 15)
        return f"cancelled (scancel): killed by signal {sig}"
    if word == "failed":
        bad = [r for r in rows if r["state"] == "failed"]
        return "failed (" + "; ".join(f"task {r['task']}: {r['slurm_state'] or 'exit'} exit status "
                                      f"{'unknown' if r['exit_code'] is None else r['exit_code']}"
                                      for r in bad) + ")"
    if word == "pending":
        reasons = sorted({r["reason"] for r in rows if r["state"] == "pending" and r["reason"]})
        return f"pending (waiting for the scheduler: {', '.join(reasons) or 'no reason given'})"
    if word == "unknown":
        return ("unknown: the scheduler no longer lists it (no accounting on this cluster) and it left no exit "
                "file; see its log with fab logs")
    return "running"


def run_extract(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host
    spec = job_spec(plan, node)
    assert spec is not None
    shards = _shards(plan)
    if shards < 1:
        return Result(host.name, "extract", Status.FAILED, f"--shards {plan.options.get('shards')!r}: give a number "
                      "of shards from 1 to 1000", code=EXIT_FAILED)
    spec.env.update(dict(host.env))  # the inventory's values (tokens, SLURM_CONF) win over the playbook's
    spec.secret_env |= set(host.secret_env)
    notes = list(spec.notes)
    if plan.playbook is not None and spec.preflight:
        # The playbook's fast checks on the login node's venv (a cluster shares it with the compute nodes). No
        # GPU gate: the login node has no GPUs of the job's, and Slurm hands the job free ones (--gres).
        checked, _ = node.call("preflight", preflight_request(plan.playbook, spec), timeout=600)
        verify = judged_checks(checked.get("verify", {}), plan.playbook.allow_prereleases)
        bad = [c for c in verify.get("items", []) if not c["ok"]]
        if bad:
            reasons = "; ".join(f"check {c['name']} [{c['kind']}]: {c['msg']}" for c in bad)
            if not plan.options.get("force"):
                return Result(host.name, "extract", Status.FAILED, f"refused to submit {spec.name}: {reasons} "
                              "(--force overrides)", [Item(f"check {c['name']} [{c['kind']}]", Status.FAILED,
                                                           c["msg"]) for c in bad], code=EXIT_FAILED)
            notes.append(f"--force: submitted despite: {reasons}")
    opts = {"partition": host.partition, "account": host.account, "gres": host.gres, "time_limit": host.time_limit,
            "shards": shards}
    answer = _call(node, "submit", {**spec.start_request(), "slurm": opts}, timeout=300)
    if answer.get("error_kind") == "drained":
        return drained(host.name, "extract", (answer.get("details") or {}).get("drain") or {}, f"submit {spec.name}")
    if not answer.get("ok"):
        return agent_error(host.name, "extract", answer, with_kind=True)
    job = answer["job"]
    run.job_launched(host.name, job["id"], "submitted to Slurm")  # this run's `tail` shows it from its first line
    try:
        sid = sp.parse_sbatch(answer["sbatch"]["stdout"])
    except sp.SlurmParseError as exc:
        return Result(host.name, "extract", Status.FAILED, f"{exc}; job {job['id']} may have been submitted: check "
                      f"squeue on {host.name}", code=EXIT_FAILED)
    what = f"a job array of {shards} tasks" if shards > 1 else "a batch job"
    items = [Item("note", Status.CHANGED, n) for n in notes]
    sbatch = job["sbatch_argv"]  # sbatch's options: the words before the batch script and its arguments
    script = next((i for i, a in enumerate(sbatch) if a.endswith("/batch.py")), len(sbatch))
    items.append(Item("sbatch", Status.CHANGED, " ".join(sbatch[1:script])))
    return Result(host.name, "extract", Status.CHANGED,
                  f"submitted job {job['id']} to Slurm as {what} (Slurm job {sid}"
                  f"{', partition ' + host.partition if host.partition else ''}"
                  f"{', gres ' + host.gres if host.gres else ''}); logs {', '.join(job['logs'])}",
                  items, data={"job": job, "slurm_job_id": sid, "shards": shards})


def _row(job: dict, r: dict, progress: str | None) -> list[str]:
    label = job["id"] + (f"[{r['task']}]" if int(job.get("shards") or 1) > 1 else "")
    state = r["state"] + (f" ({r['reason']})" if r["state"] == "pending" and r.get("reason") else "")
    return [label, f"{r.get('slurm_id') or '-'}", state, _exit_text(r), r.get("node") or "-",
            r.get("elapsed") or "-", progress or "-"]


def run_status(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = job_spec(plan, node)
    watch = LogWatch.of(spec)
    pattern = watch.progress.pattern
    answer = _call(node, "status", {"job_id": plan.options.get("job_id"), "progress_pattern": pattern})
    if answer.get("error"):
        return agent_error(host, "status", answer, with_kind=True)
    job = answer["job"]
    rows = tasks_view(answer)
    word = sp.overall([r["state"] for r in rows])
    code = _code(rows)
    last = answer.get("last_progress") or []
    parsed = [parse_progress(line, watch.progress) if line else None for line in last]
    table = [_row(job, r, bar(p) if p else None) for r, p in zip(rows, parsed + [None] * len(rows))]
    nodes = sorted({r["node"] for r in rows if r.get("node")})
    msg = (f"job {job['id']} (Slurm job {job.get('slurm_job_id')}): {_describe(rows)}"
           + (f"; on node {', '.join(nodes)}" if nodes else "")
           + (f"; {len(rows)} tasks: " + ", ".join(f"{r['task']} {r['state']}" for r in rows) if len(rows) > 1 else "")
           + (f". {rows[0]['reused']}" if rows and rows[0].get("reused") else ""))
    status = Status.FAILED if code else Status.OK
    return Result(host, "status", status, msg, code=code,
                  data={"job": job, "state": word, "scheduler": "slurm", "tasks": rows, "nodes": nodes,
                        "last_progress": last, "reused": bool(rows and rows[0].get("reused")),
                        "table": {"title": f"{host}: Slurm job", "columns": ["job", "slurm id", "state", "exit",
                                                                             "node", "elapsed", "last progress"],
                                  "rows": table}})


def _label(host: str, task: int, shards: int) -> str:
    return f"{host}[{task}]" if shards > 1 else host


def run_tail(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = job_spec(plan, node)
    watch = LogWatch.of(spec)
    offsets: list[int] | None = None  # attaching: the node starts each task at its last N lines, or at byte 0
    start = tail_start(run, plan, host)
    if isinstance(start, Result):
        return start
    job_id, last_lines, from_start = start
    link = Reconnect(run.interrupted)  # Ctrl-C closes the link on purpose: not a lost connection
    last_progress: dict[int, dict] = {}
    seen_states: list[str] = []
    reporter = run.reporter
    while True:
        if run.interrupted.is_set():
            reporter.note(f"{host} | detached: Slurm job {job_id} keeps running (fab -H {host} tail to re-attach)")
            return Result(host, "tail", Status.OK, f"detached; job {job_id} still in Slurm", code=130,
                          data={"job_id": job_id, "offsets": offsets, "detached": True})
        try:
            request: dict = {"job_id": job_id, "offsets": offsets, "wait_s": TAIL_WAIT_S}
            if offsets is None:
                request.update(last_lines=last_lines, from_start=from_start)
            answer = _call(node, "tail", request, timeout=TAIL_WAIT_S + 90)
        except TransportError as exc:
            gave_up = link.lost(exc, node, reporter.note)
            if gave_up:
                return Result(host, "tail", Status.UNREACHABLE, gave_up, data={"job_id": job_id, "offsets": offsets})
            continue
        if answer.get("error"):
            return agent_error(host, "tail", answer)
        link.back()
        job = answer["job"]
        job_id = job["id"]
        shards = int(job.get("shards") or 1)
        rows = tasks_view(answer)
        word = sp.overall([r["state"] for r in rows])
        if not seen_states or seen_states[-1] != word:
            seen_states.append(word)
            _note_state(run, host, job, rows, word)
        _show_output(run, watch, host, job_id, shards, answer, attached=offsets is None, last_progress=last_progress)
        offsets = answer["next_offsets"]
        if word not in ("running", "pending") and not any(answer["data"]):
            code = _code(rows)
            end = _describe(rows)
            reporter.note(f"{host} | job {job_id} {end}")
            return Result(host, "tail", Status.OK if code == 0 else Status.FAILED, f"job {job_id} {end}", code=code,
                          data={"job_id": job_id, "state": word, "tasks": rows, "states_seen": seen_states,
                                "bytes": offsets, "failures": watch.failures[:20],
                                "last_progress": {t: bar(p) for t, p in last_progress.items()}})


def _note_state(run: RunState, host: str, job: dict, rows: list[dict], word: str) -> None:
    """A job that became pending or running says so once, with the nodes it runs on."""
    if word in ("pending", "running"):
        where = sorted({r["node"] for r in rows if r.get("node")})
        run.reporter.note(f"{host} | Slurm job {job.get('slurm_job_id')}: {_describe(rows)}"
                          + (f" on {', '.join(where)}" if where and word == "running" else ""))


def _show_output(run: RunState, watch: LogWatch, host: str, job_id: str, shards: int, answer: dict, *, attached: bool,
                 last_progress: dict[int, dict]) -> None:
    """One tail answer's lines, per task; on attaching, the bytes each task skipped are said first."""
    if attached:
        for task, skip in enumerate(answer.get("skipped") or []):
            if skip.get("skipped_bytes"):
                run.reporter.note(skipped_note(_label(host, task, shards), job_id, skip))
    for task, data in enumerate(answer["data"]):
        for line in data.splitlines():
            failed, progress = watch.read(line)
            if progress:
                last_progress[task] = progress
            run.reporter.job_line(_label(host, task, shards), line, failed, progress)


def run_logs(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = job_spec(plan, node)
    watch = LogWatch.of(spec)
    answer = _call(node, "logs", {"job_id": plan.options.get("job_id"), "lines": int(plan.options.get("lines") or 50)})
    if answer.get("error"):
        return agent_error(host, "logs", answer)
    job = answer["job"]
    shards = int(job.get("shards") or 1)
    for task, lines in enumerate(answer["lines"]):
        for line in lines:
            run.reporter.job_line(_label(host, task, shards), line, is_failure(line, watch.failure), None)
    word = sp.overall([r["state"] for r in tasks_view(answer)])
    count = sum(len(x) for x in answer["lines"])
    return Result(host, "logs", Status.OK, f"job {job['id']} ({word}): last {count} lines of "
                  f"{', '.join(job['logs'])}", data={"lines": answer["lines"], "state": word})


def run_stop(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    answer = _call(node, "cancel", {"job_id": plan.options.get("job_id"),
                                    "grace_s": float(plan.options.get("grace") or 10)}, timeout=300)
    if answer.get("error"):
        return agent_error(host, "stop", answer)
    job = answer["job"]
    rows = tasks_view(answer)
    word = sp.overall([r["state"] for r in rows])
    if not answer.get("changed"):
        reused = f"; {rows[0]['reused']}" if rows and rows[0].get("reused") else ""
        return Result(host, "stop", Status.OK, f"job {job['id']} (Slurm job {job.get('slurm_job_id')}) is not in the "
                      f"queue ({_describe(rows)}); nothing to cancel{reused}",
                      data={"job_id": job["id"], "tasks": rows, "reused": bool(reused)})
    scancel = answer.get("scancel") or {}
    left = [r for r in rows if r["state"] in ("running", "pending")]
    ok = scancel.get("rc") == 0 and not left
    items = [Item("scancel", Status.CHANGED if scancel.get("rc") == 0 else Status.FAILED,
                  f"{' '.join(scancel.get('argv') or ['scancel'])} exit {scancel.get('rc')}"
                  + (f": {scancel.get('stderr', '').strip()}" if scancel.get("stderr") else ""))]
    items += [Item(f"task {r['task']}", Status.OK if r["state"] not in ("running", "pending") else Status.FAILED,
                   f"{r['slurm_state'] or r['state']}" + (f" on {r['node']}" if r.get("node") else "")) for r in rows]
    msg = (f"cancelled job {job['id']} (Slurm job {job.get('slurm_job_id')}) with scancel: {word}" if ok else
           f"scancel {job.get('slurm_job_id')} did not end the job: " + ", ".join(f"task {r['task']} {r['state']}"
                                                                               for r in left)
           + f" (exit {scancel.get('rc')}); check squeue on {host}")
    return Result(host, "stop", Status.CHANGED if ok else Status.FAILED, msg, items,
                  code=0 if ok else EXIT_FAILED, data={"job_id": job["id"], "tasks": rows, "state": word})


def allocation_note(node: Connector) -> Item | None:
    """For gpu/diagnose on a login node: where fleetops' latest job runs (its allocation's node), or None."""
    answer = _call(node, "allocation", {})
    if answer.get("error"):
        return None
    rows = tasks_view(answer)
    nodes = sorted({r["node"] for r in rows if r.get("node")})
    job = answer["job"]
    word = sp.overall([r["state"] for r in rows])
    return Item("Slurm allocation", Status.OK, f"job {job['id']} (Slurm job {job.get('slurm_job_id')}) {word}"
                + (f" on node {', '.join(nodes)}" if nodes else ""), details={"nodes": nodes, "tasks": rows})


def run_gpu(run: RunState, plan: Plan, node: Connector) -> Result:
    """`gpu` on a Slurm login node: the GPUs of fleetops' running job's allocation, read on its node by the agent
    run inside the job (srun --overlap), judged by the same gate as `gpu` on an SSH node."""
    from dataclasses import replace

    from ..plans.gpugate import evaluate
    from ..plans.tables import GPU_COLUMNS, gpu_rows

    host = node.host.name
    answer = _call(node, "gpu", {})
    if answer.get("error"):
        return agent_error(host, "gpu", answer, with_kind=True)
    job = answer["job"]
    rows = tasks_view(answer)
    where = f"job {job['id']} (Slurm job {job.get('slurm_job_id')})"
    if answer.get("inside") is None:
        srun = answer.get("srun")
        if srun is None:
            return Result(host, "gpu", Status.OK, f"login node of a Slurm cluster: {where} is {_describe(rows)}; "
                          f"{answer['why']} (GPUs are Slurm's to allocate)", data={"tasks": rows})
        return Result(host, "gpu", Status.FAILED, f"could not look into {where}'s allocation on "
                      f"{answer.get('node')}: srun exit {srun['rc']}: {srun['stderr'].strip()[-300:]}",
                      code=EXIT_FAILED, data={"tasks": rows})
    inside = answer["inside"]
    if not inside.get("ok"):
        return Result(host, "gpu", Status.FAILED, f"{where} on node {answer['node']}: {inside.get('error')}",
                      code=EXIT_FAILED, data={"tasks": rows, "error_kind": inside.get("error_kind")})
    verdict = evaluate(inside, replace(plan.options["gate"], expected=None))
    return Result(host, "gpu", Status.OK if verdict.code == 0 else Status.FAILED,
                  f"{verdict.word}: allocation of {where} on node {answer['node']} (read inside the job with srun "
                  f"--overlap): {verdict.msg}", verdict.items, code=verdict.code,
                  data={"node": answer["node"], "task_job_id": answer["task_job_id"], "tasks": rows,
                        "srun_argv": answer["srun"]["argv"], "gpus": inside.get("gpus", []), "verdict": verdict.word,
                        "table": {"title": f"{host}: GPUs of Slurm job {answer['task_job_id']} on {answer['node']}",
                                  "columns": GPU_COLUMNS, "rows": gpu_rows(verdict)}})
