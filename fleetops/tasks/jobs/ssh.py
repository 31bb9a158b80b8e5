"""Jobs run by the node itself over SSH: extract (gate, then launch detached), tail (follow by byte
offset, survive dropped links), status, logs, stop. Each poll or action is one agent exec on the
host's one connection."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from shlex import quote
from typing import TYPE_CHECKING

from ...plans.gpugate import Verdict, evaluate, next_action
from ...plans.jobspec import (
    JobSpec,
    LogWatch,
    describe_end,
)
from ...plans.jobverdict import of as verdict_of
from ...results import EXIT_FAILED, Evidence, Item, Next, Result, Status
from ...results.events import Detached, JobAttached, JobEnded, JobLine
from ...results.jobs import (
    AlreadyComplete,
    JobStatus,
    Launched,
    LaunchRefused,
    SshTailDetached,
    Stopped,
    TailEnded,
    already_running,
    detached,
    launched,
    logs_result,
)
from ...wire.connector import Connector
from ..plan import drain_text, own_playbook_secrets
from . import common
from .listing import exit_text

if TYPE_CHECKING:
    from ...state import RunState
    from ..plan import Plan


def run_extract(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = common.launch_spec(plan, node)
    assert plan.playbook is not None
    # extract --shards: this host's rows
    if spec.extract is not None and plan.options.get("shard_extract"):
        spec.extract.update(plan.options["shard_extract"])
    request = common.preflight_request(plan.playbook, spec)
    if spec.extract is not None:
        # The node says whether its dataset can be read, and (without --again) whether its output
        # already holds every sample.
        request["extract"] = spec.extract
    answer, evidence = node.call("preflight", request, timeout=600)
    if answer.get("error"):  # refused before any check ran (an import path another user may change)
        return common.agent_error(host, "extract", answer, with_kind=True)
    settled = _nothing_to_launch(run, host, plan, spec, answer)
    if settled is not None:
        return settled
    # --force does not override: the job could only fail on its first read
    if answer.get("dataset"):
        return _no_dataset(host, plan, spec, answer["dataset"])
    # nor this: two runs into one output leave a manifest of one of them
    if answer.get("output_busy"):
        busy = answer["output_busy"]
        return Result(
            host,
            "extract",
            Status.FAILED,
            f"refused to launch {spec.name}: its output is in use: "
            f"{busy.get('text')}; nothing launched",
            code=EXIT_FAILED,
            payload=LaunchRefused(
                output_busy=busy,
                next=Next(
                    "wait until that run has ended (a lock its run left is cleared by the host "
                    "that took it, on its next extract there), then launch again",
                    [_extract_cmd(host, plan.options)],
                ),
            ),
        )
    problems, failing, gate = _problems(node, spec, answer, plan.playbook.allow_prereleases)
    running = answer.get("running_job")
    notes = list(spec.notes)
    if problems:
        if not plan.options.get("force") or running:
            refusal = _Refusal(problems, failing, running, gate)
            return _refused(host, plan, spec, refusal, evidence)
        reasons = "; ".join(f"{p.label}: {p.msg}" for p in problems)
        notes.append(f"--force: launched despite: {reasons}")
    started, evidence = node.call(
        "job_start", common.start_request(spec, plan.playbook), timeout=60
    )
    if not started.get("ok"):
        return _not_started(run, host, spec, started, evidence)
    job = started["job"]
    run.job_launched(host, job["id"], f"log {job['log']}")
    items = [Item("note", Status.CHANGED, n) for n in notes]
    return launched(
        host,
        f"launched job {job['id']} (pid {job['pid']}, process group {job['pgid']}); log "
        f"{job['log']}",
        items,
        Launched(job, forced=bool(problems)),
    )


@dataclass(frozen=True)
class _Refusal:
    """Why extract will not launch: the failing checks, a job still running, the GPU gate."""

    problems: list[Item]
    failing: list[dict]
    running: dict | None
    gate: Verdict | None

    def why(self) -> str:
        why = []
        if self.failing:
            why.append(f"{len(self.failing)} of the job's checks fail")
        if self.running:
            why.append(f"job {self.running['id']} is still running")
        if self.gate is not None:
            why.append(f"the GPU gate says {self.gate.word}: {self.gate.msg}")
        return "; ".join(why)


def _refused(host: str, plan: Plan, spec: JobSpec, refusal: _Refusal, evidence: Evidence) -> Result:
    return Result(
        host,
        "extract",
        Status.FAILED,
        f"refused to launch {spec.name}: {refusal.why()}",
        refusal.problems,
        evidence=evidence,
        code=EXIT_FAILED,
        payload=LaunchRefused(
            next=_refused_next(host, plan, refusal.failing, refusal.running, refusal.gate)
        ),
    )


def _nothing_to_launch(
    run: RunState, host: str, plan: Plan, spec: JobSpec, answer: dict
) -> Result | None:
    """extract's answer when it must not launch, whatever --force says: the node is drained, the
    same job is already running (then this run's `tail` attaches to it), or its output already holds
    every sample."""
    if answer.get("drain"):
        return common.drained(host, "extract", answer["drain"], f"launch {spec.name}")
    job = answer.get("running_job")
    if job and job.get("name") == spec.name:
        with run.lock:
            run.attach[host] = job["id"]
        return already_running(
            host,
            job,
            f"job {job['id']} ({spec.name}) is already running here (since "
            f"{job.get('started')}); nothing launched: `tail` attaches to it, `stop` ends it",
        )
    done = answer.get("complete")
    if done and done.get("interrupted"):
        late = done["interrupted"]
        return Result(
            host,
            "extract",
            Status.FAILED,
            f"{spec.name}: its output {done['output']} holds every sample, "
            f"but the latest run on it, job {late['job']} (extract --again), ended {late['state']} "
            f"({late['how']}) before it redid any: nothing launched; extract --again redoes it",
            code=EXIT_FAILED,
            payload=AlreadyComplete(
                done,
                next=Next(
                    "redo what that run was asked to redo",
                    [_extract_cmd(host, plan.options, again=True)],
                ),
            ),
        )
    if done:
        return Result(
            host,
            "extract",
            Status.OK,
            f"{spec.name}: its output {done['output']} is already complete "
            f"({done['done']}/{done['total']} samples, "
            f"{done.get('runs', '?')} runs); nothing launched "
            "(--again redoes it)",
            payload=AlreadyComplete(done),
        )
    return None


def _extract_cmd(host: str, options: dict, again: bool | None = None) -> str:
    """The same extract again (`options`: the command's), its --job, --playbook and --again kept."""
    again = bool(options.get("again")) if again is None else again
    job = (
        f" --job {quote(str(options['job']))}"
        if options.get("job") not in (None, "extract")
        else ""
    )
    book = f" --playbook {quote(str(options['playbook']))}" if options.get("playbook") else ""
    return f"fab -H {quote(host)} extract{job}{book}" + (" --again" if again else "")


def _no_dataset(host: str, plan: Plan, spec: JobSpec, dataset: dict) -> Result:
    fab = f"fab -H {quote(host)}"
    path = str(dataset.get("path"))
    return Result(
        host,
        "extract",
        Status.FAILED,
        f"refused to launch {spec.name}: its dataset {path} cannot be read "
        f"on {host}: {dataset.get('error')}; nothing launched",
        code=EXIT_FAILED,
        payload=LaunchRefused(
            dataset=dataset,
            next=Next(
                f"put the dataset at {path} on {host} (or point "
                "the playbook's dataset: at it), then launch "
                "again",
                [f"{fab} run {quote('ls -l ' + quote(path))}", _extract_cmd(host, plan.options)],
            ),
        ),
    )


def _not_started(
    run: RunState, host: str, spec: JobSpec, started: dict, evidence: Evidence
) -> Result:
    """The node's launch lock decided otherwise after the preflight looked: drained meanwhile, or
    the same job launched by another extract a moment ago (left alone, as when the preflight finds
    it)."""
    details = started.get("details") or {}
    if started.get("error_kind") == "drained":
        return common.drained(host, "extract", details.get("drain") or {}, f"launch {spec.name}")
    job = details.get("job") or {}
    if (
        started.get("error_kind") == "job_running"
        and job.get("name") == spec.name
        and job.get("id")
    ):
        with run.lock:
            run.attach[host] = job["id"]
        return already_running(
            host,
            {k: v for k, v in job.items() if k != "env"},
            f"job {job['id']} ({spec.name}) is already running on this node (launched by another "
            "extract a moment ago); nothing launched: `tail` attaches to it",
        )
    return Result(
        host,
        "extract",
        Status.FAILED,
        started.get("error", "job did not start"),
        evidence=evidence,
        code=EXIT_FAILED,
    )


def _problems(
    node: Connector, spec: JobSpec, answer: dict, allow_prereleases: bool
) -> tuple[list[Item], list[dict], Verdict | None]:
    """What stands in the way of launching: a failed fast check, another job running, the GPU gate;
    with the failing checks and the gate's verdict when it says no (what the next: line is made
    of)."""
    problems: list[Item] = []
    failing = [
        c for c in common.judged_checks(answer["verify"], allow_prereleases)["items"] if not c["ok"]
    ]
    for check in failing:
        problems.append(
            Item(f"check {check['name']} [{check['kind']}]", Status.FAILED, check["msg"])
        )
    if answer.get("running_job"):
        job = answer["running_job"]
        problems.append(
            Item(
                "node", Status.FAILED, f"job {job['id']} is still running (since {job['started']})"
            )
        )
    gate: Verdict | None = None
    if spec.gate is not None:
        verdict = evaluate(answer["gpu"], replace(spec.gate, expected=node.host.gpus))
        if verdict.code:
            problems.append(
                Item(
                    "GPU gate",
                    Status.FAILED,
                    verdict.msg + ("; " + "; ".join(verdict.holders) if verdict.holders else ""),
                )
            )
            gate = verdict
    return problems, failing, gate


def _refused_next(
    host: str, plan: Plan, failing: list[dict], running: dict | None, gate: Verdict | None
) -> Next:
    """What to do about each reason `extract` refused, in turn, then the same extract again. Never
    --force: a job on an unpatched node writes wrong hidden states, and one on busy GPUs fails after
    its model load."""
    fab = f"fab -H {quote(host)}"
    book = (
        f" --playbook {quote(str(plan.options['playbook']))}"
        if plan.options.get("playbook")
        else ""
    )
    again = _extract_cmd(host, plan.options)
    if running:
        return Next(
            "a job runs there: follow it until it ends (or stop it), then launch again",
            [f"{fab} tail --job-id {quote(str(running['id']))}", again],
        )
    why: list[str] = []
    commands: list[str] = []
    if any(c["kind"] == "requires" for c in failing):
        why.append(
            "the installed versions are not the ones the playbook pins (runbook new-version-landed)"
        )
        commands.append(f"{fab} facts")
    elif failing:
        why.append("patch the node and prove it")
        commands.append(f"{fab} patch verify{book}")
    if gate is not None:
        action = next_action(host, gate)
        if action is not None:
            why.append(action.why)
            commands.extend(action.commands)
    return Next("; ".join(why) + ", then launch again", [*commands, again])


def run_tail(
    run: RunState, plan: Plan, node: Connector, follow: common.TailFollower | None = None
) -> Result:
    host = node.host.name
    # attaching: the node starts at the last N lines, or at byte 0 with from_start
    offset: int | None = None
    attach = common.tail_attach(run, plan, node)
    if isinstance(attach, Result):
        return attach
    watch, job_id, last_lines, from_start, secrets = attach
    link = common.Reconnect(run.interrupted)
    last_progress: dict | None = None
    while True:
        if run.interrupted.is_set():
            return _detached(run, host, job_id, offset)
        position = {"job_id": job_id, "offset": offset}
        request = {**common.tail_request(position, (last_lines, from_start)), "mask": secrets}
        answer = link.poll(
            partial(_tail_answer, node, request),
            node,
            run.say,
            position,
            f", resuming at byte {offset}",
        )
        if not isinstance(answer, dict):  # None: asked again after a wait; a Result: the tail's end
            if answer is None:
                continue
            return answer
        job_id = answer["job_id"]
        more = _more_secrets(run, node, answer, secrets) if offset is None else []
        # the job's own playbook has secrets this run's does not: asked again, masked by the node
        if more:
            secrets += more
            continue
        if offset is None and answer.get("skipped_bytes"):
            run.emit(common.skipped(host, job_id, answer))
        run.emit(JobAttached(host, job_id, answer["state"]))
        if follow is not None:
            follow.attached(job_id)
        last_progress = _show_lines(run, watch, host, answer["data"], follow) or last_progress
        offset = answer["next_offset"]
        verdict = verdict_of(answer)
        if verdict.ended and not answer["data"]:
            code = verdict.code
            end = end_text(answer)
            run.emit(JobEnded(host, verdict.word))
            return common.tail_ended(
                run,
                host,
                job_id,
                end,
                code,
                [last_progress],
                TailEnded(
                    job_id,
                    answer.get("exit"),
                    verdict.word,
                    offset,
                    watch.failures[:20],
                    link.count,
                    answer.get("cause"),
                    last_progress and common.bar(last_progress),
                ),
            )


def _detached(run: RunState, host: str, job_id: str | None, offset: int | None) -> Result:
    """Ctrl-C while following: the job runs on, and the command that follows it again."""
    job = job_id or "(the latest)"
    again = f"fab -H {quote(host)} tail"
    if job_id:
        again += f" --job-id {quote(job_id)}"
    run.emit(Detached(host, job_id))
    return detached(
        host,
        f"detached; job {job} still running",
        SshTailDetached(job_id, offset or 0, True, Next("follow it again", [again])),
    )


def _more_secrets(run: RunState, node: Connector, answer: dict, secrets: list[str]) -> list[str]:
    """The secrets of the job's own playbook that this run's does not mask yet."""
    return [v for v in own_playbook_secrets(run, node, answer) if v not in secrets]


def _show_lines(
    run: RunState, watch: LogWatch, host: str, data: str, follow: common.TailFollower | None
) -> dict | None:
    """One answer's lines, each read for failures and progress; the last progress among them."""
    last_progress = None
    for line in data.splitlines():
        failed, progress = watch.read(line)
        if progress:
            last_progress = progress
        run.emit(JobLine(host, line, failed, progress))
        if follow is not None:
            follow.line(progress)
    return last_progress


def _tail_answer(node: Connector, request: dict) -> dict:
    return node.call("job_tail", request, timeout=common.TAIL_WAIT_S + 30)[0]


def end_text(answer: dict) -> str:
    """How the job ended, with what went wrong around it (a full disk, its wrapper killed) when the
    node knows: the cause in place of the generic guess of a `lost` job."""
    cause = answer.get("cause")
    if answer.get("state") == "lost" and cause:
        return f"lost: {cause}"
    end = describe_end(answer)
    return f"{end}; {cause}" if cause else end


def _status_row(answer: dict) -> list[str]:
    job = answer["job"]
    runtime = answer.get("runtime_s")
    return [
        job["id"],
        answer["state"],
        exit_text(answer),
        f"{runtime:.0f}s" if runtime is not None else "?",
        answer.get("last_progress") or "-",
        job["log"],
    ]


def run_status(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    spec = common.job_spec(plan, node)
    pattern = LogWatch.of(spec).progress.pattern
    answer, evidence = node.call(
        "job_status", {"job_id": plan.options.get("job_id"), "progress_pattern": pattern}
    )
    if answer.get("error"):
        return _status_error(host, answer)
    job = answer["job"] if isinstance(answer.get("job"), dict) else {}
    # loading the job's own playbook registers its secrets: the status line's last progress shows
    # them masked
    common.own_secrets(run, node, job)
    verdict = verdict_of(answer)
    answer = {**answer, "state": verdict.word} if verdict.word == "stopped" else answer
    row = _status_row(answer)
    code = verdict.code
    status = Status.OK if code == 0 else Status.FAILED
    state, items, oom = _how_it_ended(answer)
    msg = _status_msg(answer, row, state)
    job_id = quote(str(row[0]))
    nxt = _status_next(host, job_id, oom, status)
    # it was an extract --again: so is the run that redoes it
    if nxt is not None and answer["job"].get("again"):
        nxt.why += (
            "; then the same extract --again (a plain extract "
            "resumes only what that run's manifest holds)"
        )
        nxt.commands.append(
            _extract_cmd(host, {**plan.options, "job": answer["job"].get("name")}, again=True)
        )
    if answer.get("left"):
        nxt = nxt or Next("", [])
        nxt.why = "; ".join(x for x in (nxt.why, "stop what it left running") if x)
        nxt.commands.append(f"fab -H {quote(host)} stop --job-id {job_id}")
    return Result(
        host,
        "status",
        status,
        msg,
        items,
        code=code,
        payload=JobStatus(
            answer["job"],
            answer["state"],
            answer.get("exit"),
            answer.get("drain"),
            answer.get("runtime_s"),
            answer.get("last_progress"),
            answer.get("cause"),
            answer.get("tagged"),
            answer.get("left"),
            oom,
            nxt,
            {
                "title": f"{host}: job",
                "columns": ["job", "state", "exit", "runtime", "last progress", "log"],
                "rows": [row],
            },
        ),
    )


def _status_error(host: str, answer: dict) -> Result:
    """The agent's error, with the node's drain marker when it has one."""
    result = common.agent_error(host, "status", answer, with_kind=True)
    details = answer.get("details")
    drain = details.get("drain") if isinstance(details, dict) else None
    if drain:
        result.msg += f"; {drain_text(drain)}"
        result.data["drain"] = drain
    return result


def _status_msg(answer: dict, row: list, state: str) -> str:
    """The job's state, exit, runtime and last progress; why it ended, what it left, a drain."""
    msg = f"job {row[0]}: {state}, exit {row[2]}, runtime {row[3]}, last progress: {row[4]}"
    if answer.get("cause"):
        msg += f"; {answer['cause']}"
    if answer.get("left"):
        msg += f"; its processes {answer['left']} still run"
    if answer.get("drain"):
        msg += f"; {drain_text(answer['drain'])}"
    return msg


def _status_next(host: str, job_id: str, oom: dict | None, status: Status) -> Next | None:
    """What to read next: the OOM advice for a job the kernel killed, the log of a failed one."""
    if oom is not None:
        # diagnose's parsers: loaded only for a job the kernel killed
        from ...plans.kernellog import OOM_ADVICE

        return Next(OOM_ADVICE, [f"fab -H {quote(host)} logs --job-id {job_id}"])
    if status is Status.FAILED:
        return Next(
            "read why it ended", [f"fab -H {quote(host)} logs --job-id {job_id} --lines 200"]
        )
    return None


def _how_it_ended(answer: dict) -> tuple[str, list[Item], dict | None]:
    """The job's state in words; for a SIGKILL or a lost job, whether the kernel's OOM killer did
    it, with the kernel's own lines as the evidence (the node reads its kernel log for such a job:
    plans/kernellog.py)."""
    from ...plans.kernellog import evidence_lines, oom_of_job, oom_text, sigkill_note

    state, ended, kernel = answer["state"], answer.get("exit") or {}, answer.get("kernel")
    if state == "stopped":
        return describe_end(answer), [], None
    if state not in ("killed", "lost"):
        return state, [], None
    kill = (
        oom_of_job(kernel, {**answer["job"], "state": state, "exit": ended})
        if isinstance(kernel, dict)
        else None
    )
    if kill is not None:
        lines = evidence_lines(kill)
        return (
            "killed by the kernel's OOM killer",
            [Item("OOM killer", Status.FAILED, oom_text(kill), {"evidence": lines})],
            {
                "pid": kill.pid,
                "process": kill.process,
                "at": kill.epoch,
                "cgroup": kill.cgroup_oom,
                "lines": lines,
            },
        )
    if state == "lost":
        return state, [], None
    words = f"killed by signal {ended.get('signal')}"
    if ended.get("signal") == 9 and isinstance(kernel, dict):
        words += f" ({sigkill_note(not kernel.get('error'))})"
    return words, [], None


def run_logs(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    request, watch = common.logs_request(plan, node)
    answer, _ = node.call("job_logs", request)
    more = [v for v in own_playbook_secrets(run, node, answer) if v not in request["mask"]]
    # the job's own playbook has secrets this run's does not: asked again, masked by the node
    if more:
        answer, _ = node.call(
            "job_logs", {**request, "job_id": answer["job_id"], "mask": request["mask"] + more}
        )
    if answer.get("error"):
        return common.agent_error(host, "logs", answer)
    common.print_lines(run, host, answer["lines"], watch)
    return logs_result(
        host,
        answer["job_id"],
        answer["state"],
        len(answer["lines"]),
        answer["log"],
        answer["lines"],
    )


def run_stop(run: RunState, plan: Plan, node: Connector) -> Result:
    host = node.host.name
    answer, evidence = node.call(
        "job_stop",
        {"job_id": plan.options.get("job_id"), "grace_s": float(plan.options.get("grace") or 10)},
        timeout=120,
    )
    if answer.get("error"):
        return common.agent_error(host, "stop", answer)
    items = [_gpu_memory_item(node, answer)] if answer.get("changed") else []
    status = _stop_status(answer, items)
    return Result(
        host,
        "stop",
        status,
        answer["msg"],
        items,
        evidence=evidence if status is Status.FAILED else None,
        code=EXIT_FAILED if status is Status.FAILED else 0,
        payload=Stopped(answer["job_id"], answer.get("left")),
    )


def _gpu_memory_item(node: Connector, answer: dict) -> Item:
    """Whether the stopped job's GPU memory was released."""
    snap, _ = node.call("gpu", {})
    if not snap.get("ok"):
        return Item("GPU memory", Status.OK, f"not checked: {snap.get('error')}")
    # By process group as well as by job label: once exit.json exists the node no longer labels
    # the group's processes with the job, and a survivor must still count as the job's.
    pgid = answer.get("pgid")

    def the_jobs(p: dict) -> bool:
        return p.get("job") == answer["job_id"] or (pgid is not None and p.get("pgid") == pgid)

    held = [(g["index"], p) for g in snap["gpus"] for p in g["processes"] if the_jobs(p)]
    if not held:
        return Item("GPU memory", Status.OK, "released: no GPU process belongs to the job")
    pids = "; ".join(f"GPU {i}: pid {p['pid']} {p['used_mib']} MiB" for i, p in held)
    return Item("GPU memory", Status.FAILED, f"still held: {pids}")


def _stop_status(answer: dict, items: list[Item]) -> Status:
    if not answer["ok"] or any(i.status is Status.FAILED for i in items):
        return Status.FAILED
    return Status.CHANGED if answer.get("changed") else Status.OK


class SshJobs(common.TaskBackend):
    """A host with no scheduler: the node's agent launches, watches and stops the job itself."""

    tasks = common.BackendTasks(run_extract, run_status, run_tail, run_logs, run_stop)

    def running_job(self, node: Connector) -> dict | None:
        current, _ = node.call("job_status", {"job_id": None})
        if current.get("error") or current.get("state") not in ("running", "starting"):
            return None
        return current["job"]


SSH = common.register(SshJobs())
