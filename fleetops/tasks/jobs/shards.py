"""`extract --shards` across hosts: one shard of the playbook job's dataset per selected host whose
backend shards by host (shard i of N to the i-th host in name order, fleetops/plans/shards.py), each
launched by its backend's ordinary launch (given the shard's dataset and output folder) and resumed
by it; the fleet manifest <project>/.fleetops/shards/<job>.json records which host has which rows,
its jobs, its sample count and, once known, the sha256 of its manifest and samples. `status` and
`tail` on a sharded job add one aggregated line (samples done/total, summed tok/s, ETA of the
slowest shard) to the per-host lines. A backend that shards inside one host (a Slurm job array) is
handed --shards N as it is."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...plans import shards as shardplan
from ...plans.jobspec import JobSpec, parse_progress
from ...results import EXIT_FAILED, Result, Status
from ...results.events import FleetSummary, JobAttached, JobEnded, JobLine
from ...wire.connector import Connector
from ..plan import Plan, agent_error, job_spec
from .backend import JobBackend, backend_for

if TYPE_CHECKING:
    from ...state import RunState

EXIT_USAGE = 2
AGGREGATE_EVERY_S = 1.0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Fleet:
    """What the hosts of one run share about a job's shard plan, across the run's tasks: decided or
    read once, saved under one lock. One per run and job: a copy per task would write back what it
    read before another task's host recorded its shard."""

    def __init__(self, run: RunState, job: str) -> None:
        self.lock = threading.Lock()
        self.job = job
        self.path = shardplan.manifest_path(run.root, self.job)
        self.doc: dict | None = None
        self.mode = ""
        self.error: str | None = None
        # step -> the hosts whose answer this step has (the last one prints the fleet line)
        self.reported: dict[str, set[str]] = {}
        # step -> the hosts whose job in this step is their shard's: a later job on a host (a plain
        # extract after the sharded one) is that host's own, and its status or tail says nothing of
        # the shard plan.
        self.ours: dict[str, set[str]] = {}
        # the steps whose fleet line is out: once per step, by one host
        self.summarized: set[str] = set()
        self.live: dict[str, dict] = {}
        self.last_line = 0.0
        self.attached = False
        self.save_error: str | None = None

    def shard(self, host: str) -> dict | None:
        return next((s for s in (self.doc or {}).get("shards", []) if s["host"] == host), None)

    def save(self) -> None:
        """Written atomically; a laptop-side write error is kept (and shown in the fleet line), not
        raised: the nodes' own state is the truth and the next status writes the plan again."""
        assert self.doc is not None
        self.doc["updated"] = _now()
        self.doc["complete"] = not shardplan.unfinished(self.doc)
        try:
            shardplan.save(self.path, self.doc)
            self.save_error = None
        except OSError as exc:
            self.save_error = f"{self.path} not written: {exc.strerror or exc}"

    def rows(self) -> list[dict]:
        out = []
        for s in (self.doc or {}).get("shards", []):
            live = self.live.get(s["host"], {})
            out.append(
                {
                    "host": s["host"],
                    "done": live.get("done", s.get("done") or 0),
                    "total": live.get("total", s.get("samples") or 0),
                    "tok_s": live.get("tok_s"),
                    "eta": live.get("eta"),
                    "state": live.get("state", s.get("state") or "unknown"),
                }
            )
        return out


def _fleet(run: RunState, plan: Plan) -> Fleet:
    job = plan.options.get("job") or "extract"
    with run.lock:
        fleet = run.shared.get(("shards", job))
        if fleet is None:
            fleet = run.shared["shards", job] = Fleet(run, job)
        return fleet


def _sharded_hosts(run: RunState) -> list[str]:
    """The selected hosts that take one shard each (a job array's host shards inside itself)."""
    return [n for n in run.selected if backend_for(run.inventory.resolve(n)).shards_by_host]


def _decide(run: RunState, plan: Plan, fleet: Fleet) -> None:
    """Once per run, before any host launches: how many shards, and the plan (new, resumed or
    refused)."""
    with fleet.lock:
        if fleet.doc is not None or fleet.error is not None:
            return
        hosts = _sharded_hosts(run)
        try:
            shardplan.count(plan.options.get("shards"), len(hosts))
            doc, mode = shardplan.decide(
                shardplan.load(fleet.path), fleet.job, hosts, _now(), fleet.path
            )
            fleet.doc, fleet.mode = doc, mode
            fleet.save()
            if fleet.save_error:
                fleet.doc, fleet.error = (
                    None,
                    f"{fleet.save_error}: the shard plan must be on disk before any "
                    "shard starts; nothing launched",
                )
        except shardplan.ShardError as exc:
            fleet.error = str(exc)


def run_extract(run: RunState, plan: Plan, node: Connector, backend: JobBackend) -> Result:
    host = node.host.name
    fleet = _fleet(run, plan)
    _decide(run, plan, fleet)
    if fleet.error is not None:
        return Result(
            host,
            "extract",
            Status.FAILED,
            fleet.error,
            code=EXIT_USAGE,
            data={"error_kind": "shards"},
        )
    spec = job_spec(plan, node)
    assert spec is not None
    if spec.kind != "extract" or spec.extract is None:
        return Result(
            host,
            "extract",
            Status.FAILED,
            f"--shards: job {spec.name!r} is a {spec.kind} job; only an "
            "extract job's dataset can be split",
            code=EXIT_USAGE,
        )
    shard = fleet.shard(host)
    assert shard is not None and fleet.doc is not None
    i, of = shard["index"], shard["of"]
    prep, _ = node.call(
        "shards", {"action": "prepare", "extract": spec.extract, "index": i, "of": of}, timeout=300
    )
    if prep.get("error"):
        return agent_error(host, "extract", prep, with_kind=True)
    with fleet.lock:
        other = _other_dataset(host, fleet, prep)
        if other is not None:
            return other
        complete = _record_prepared(shard, prep, again=bool(plan.options.get("again")))
        fleet.save()
    where = (
        f"shard {i} of {of} (rows {shard['start']}-{shard['end'] - 1} "
        f"of {prep['rows']}, {shard['samples']} "
        "samples)"
    )
    data: dict[str, Any] = {"shard": dict(shard), "plan": str(fleet.path), "plan_mode": fleet.mode}
    if complete:
        return Result(
            host,
            "extract",
            Status.OK,
            f"{where} already complete ({prep['done']}/{shard['samples']} in "
            f"{prep['shard_output']}); nothing to do",
            data=data,
        )
    current = backend.running_job(node)
    if current is not None and current["id"] in shard["jobs"]:
        return Result(
            host,
            "extract",
            Status.OK,
            f"{where}: still running as job {current['id']} "
            f"({prep['done']}/{shard['samples']} done); left alone",
            data={**data, "job": current},
        )
    extract = {
        "dataset": prep["shard_dataset"],
        "output": prep["shard_output"],
        "shard": {
            "index": i,
            "of": of,
            "start": shard["start"],
            "end": shard["end"],
            "dataset": prep["dataset"],
            "hosts": fleet.doc["hosts"],
        },
    }
    result = backend.launch(
        run, replace(plan, options={**plan.options, "shard_extract": extract}), node
    )
    _note_launched(fleet, shard, prep, where, result)
    result.data.update(data, shard=dict(shard))
    return result


def _other_dataset(host: str, fleet: Fleet, prep: dict) -> Result | None:
    """A refusal when this host's dataset is not the one the shard plan splits; the first host's
    dataset becomes the plan's. Called with the plan's lock held."""
    assert fleet.doc is not None
    known = fleet.doc.get("dataset")
    if not known:
        fleet.doc["dataset"] = {
            "path": prep["dataset"],
            "sha256": prep["dataset_sha256"],
            "rows": prep["rows"],
            "host": host,
        }
        return None
    if known["sha256"] == prep["dataset_sha256"] and known["rows"] == prep["rows"]:
        return None
    return Result(
        host,
        "extract",
        Status.FAILED,
        f"refused: the dataset on {host} ({prep['dataset']}, {prep['rows']} rows, sha256 "
        f"{prep['dataset_sha256'][:16]}...) is not the one the shard plan splits "
        f"({known['rows']} rows, sha256 {known['sha256'][:16]}... first seen on "
        f"{known['host']}); give every host the same "
        f"file, or move {fleet.path} aside to start over",
        code=EXIT_FAILED,
        data={"error_kind": "shards"},
    )


def _record_prepared(shard: dict, prep: dict, *, again: bool) -> bool:
    """The node's preparation written into the shard; whether its output already holds every
    sample (never with --again)."""
    shard.update(
        start=prep["start"],
        end=prep["end"],
        samples=prep["end"] - prep["start"],
        dataset=prep["shard_dataset"],
        output=prep["shard_output"],
        done=prep["done"],
    )
    complete = (
        prep["done"] >= shard["samples"] and prep.get("manifest_sha256") is not None and not again
    )
    if complete:
        shard.update(
            complete=True,
            state="succeeded",
            manifest_sha256=prep.get("manifest_sha256"),
            samples_sha256=prep.get("samples_sha256"),
        )
    return complete


def _note_launched(fleet: Fleet, shard: dict, prep: dict, where: str, result: Result) -> None:
    """A launched job recorded in its shard, and the shard named in the result's line."""
    job = result.data.get("job") or {}
    if result.status is not Status.CHANGED or not job.get("id"):
        return
    with fleet.lock:
        shard["jobs"].append(job["id"])
        shard["state"] = "running"
        fleet.save()
    resumed = f", resuming at {prep['done']}/{shard['samples']}" if prep["done"] else ""
    result.msg = f"{where}{resumed}: {result.msg}"


def _progress(spec: JobSpec | None, text: str | None) -> dict:
    if not text or spec is None:
        return {}
    return parse_progress(text, spec.progress) or {}


def _record(
    run: RunState,
    node: Connector,
    plan: Plan,
    fleet: Fleet,
    state: str,
    job_id: str | None,
    progress: dict,
) -> dict | None:
    """The host's shard as its node sees it now (the shard output's manifest), into the fleet
    manifest."""
    host = node.host.name
    shard = fleet.shard(host)
    spec = job_spec(plan, node)
    if shard is None or spec is None or spec.extract is None:
        return None
    rep, _ = node.call(
        "shards",
        {
            "action": "report",
            "extract": spec.extract,
            "index": shard["index"],
            "of": shard["of"],
            "samples": shard.get("samples") or 0,
        },
        timeout=300,
    )
    if rep.get("error"):
        return None
    ours = job_id in shard["jobs"]
    with fleet.lock:
        shard.update(done=rep["done"], runs=rep.get("runs"))
        if ours:
            shard["state"] = state
        samples = shard.get("samples") or rep["total"]
        if rep["done"] >= samples and rep.get("manifest_sha256"):
            shard.update(
                complete=True,
                manifest_sha256=rep["manifest_sha256"],
                samples_sha256=rep["samples_sha256"],
            )
        live = {"done": rep["done"], "total": samples, "state": state if ours else "not running"}
        if ours and state in ("running", "starting"):
            live.update({k: progress[k] for k in ("tok_s", "eta") if k in progress})
        fleet.live[host] = live
        fleet.save()
    return {**rep, "ours": ours}


def _all_in(run: RunState, fleet: Fleet, step: str) -> bool:
    assert fleet.doc is not None
    return set(run.selected) & set(fleet.doc["hosts"]) <= fleet.reported.get(step, set())


def _claim_summary(run: RunState, fleet: Fleet, step: str) -> bool:
    """True for the one host that prints this step's fleet line (call under fleet.lock, with the
    host just marked reported). Several hosts could find all in at once: found by CI, `status` gave
    two hosts the fleet aggregate."""
    if step in fleet.summarized or not _all_in(run, fleet, step) or not fleet.ours.get(step):
        return False
    fleet.summarized.add(step)
    return True


def _summary(run: RunState, fleet: Fleet, result: Result | None) -> None:
    agg = shardplan.aggregate(fleet.rows())
    complete = sum(1 for s in (fleet.doc or {}).get("shards", []) if s.get("complete"))
    agg["complete_shards"] = complete
    run.emit(
        FleetSummary(
            shardplan.line(agg), complete, agg["shards"], str(fleet.path), fleet.save_error or None
        )
    )
    # None: this host's own step raised; its failed result is made by the registry
    if result is not None:
        result.data["fleet"] = {**agg, "plan": str(fleet.path)}


def _load_view(run: RunState, plan: Plan, node: Connector, backend: JobBackend) -> Fleet | None:
    """The shard plan when this host is part of one (and no --job-id picks another job), else
    None."""
    if plan.options.get("job_id") or not backend.shards_by_host:
        return None
    fleet = _fleet(run, plan)
    with fleet.lock:
        if fleet.doc is None and fleet.error is None:
            try:
                fleet.doc = shardplan.load(fleet.path)
            except shardplan.ShardError as exc:
                fleet.error = str(exc)
    if fleet.doc is None or fleet.shard(node.host.name) is None:
        return None
    return fleet


def run_status(run: RunState, plan: Plan, node: Connector, backend: JobBackend) -> Result:
    fleet = _load_view(run, plan, node, backend)
    if fleet is None:
        return backend.status(run, plan, node)
    result: Result | None = None
    try:
        result = backend.status(run, plan, node)
        job = (result.data.get("job") or {}).get("id")
        if job is not None and _is_ours(fleet, node.host.name, job, "status"):
            _shard_status(run, node, plan, fleet, result, job)
    finally:
        with fleet.lock:
            fleet.reported.setdefault("status", set()).add(node.host.name)
            last = _claim_summary(run, fleet, "status")
        if last:
            _summary(run, fleet, result)
    assert result is not None  # the backend returned (else its exception is on its way up)
    return result


def _is_ours(fleet: Fleet, host: str, job: str | None, step: str) -> bool:
    """This host's job is one its shard ran (then the step is part of the shard plan's view). A job
    the plan as loaded does not name is looked up in the plan on disk: this run's own sharded
    extract may have added it."""
    if not job:
        return False
    with fleet.lock:
        shard = fleet.shard(host)
        if shard is None:
            return False
        if job not in shard["jobs"]:
            try:
                disk = shardplan.load(fleet.path) or {}
            except shardplan.ShardError:
                disk = {}
            for saved in disk.get("shards", []):
                if saved.get("host") == host and saved.get("index") == shard["index"]:
                    shard["jobs"] = list(
                        dict.fromkeys([*shard["jobs"], *(saved.get("jobs") or [])])
                    )
        if job in shard["jobs"]:
            fleet.ours.setdefault(step, set()).add(host)
            return True
        return False


def _shard_status(
    run: RunState, node: Connector, plan: Plan, fleet: Fleet, result: Result, job: str
) -> None:
    state = result.data.get("state") or "unknown"
    rep = _record(
        run,
        node,
        plan,
        fleet,
        state,
        job,
        _progress(job_spec(plan, node), result.data.get("last_progress")),
    )
    shard = fleet.shard(node.host.name) or {}
    if rep is not None:
        result.msg = (
            f"shard {shard['index']} of {shard['of']} ({rep['done']}/{shard.get('samples')} samples"
            f"{', complete' if shard.get('complete') else ''}): {result.msg}"
        )
        result.data["shard"] = dict(shard)


class _FleetFollower:
    """Follows one host's tail for the fleet's aggregated line (TailFollower): which job it attached
    to, and the progress of each of its lines."""

    def __init__(self, run: RunState, fleet: Fleet, host: str) -> None:
        self._run, self._fleet, self._host = run, fleet, host
        self.ours = False  # the job tail follows is the host's shard's (known once tail attaches)
        self._job: str | None = None

    def attached(self, job_id: str) -> None:
        if job_id != self._job:  # once per job: every poll of the tail says it again
            self._job = job_id
            self.ours = _is_ours(self._fleet, self._host, job_id, "tail")

    def line(self, progress: dict | None) -> None:
        if not self.ours or not progress or "total" not in progress:
            return
        fleet = self._fleet
        with fleet.lock:
            fleet.live[self._host] = {
                "done": progress.get("done", 0),
                "total": progress["total"],
                "tok_s": progress.get("tok_s"),
                "eta": progress.get("eta"),
                "state": "running",
            }
            now = time.monotonic()
            if now - fleet.last_line < AGGREGATE_EVERY_S:
                return
            fleet.last_line = now
            agg = shardplan.aggregate(fleet.rows())
            attach = not fleet.attached
            fleet.attached = True
        if attach:
            self._run.emit(JobAttached("fleet", f"{agg['shards']} shards", "running"))
        self._run.emit(JobLine("fleet", shardplan.line(agg), False, agg))


def run_tail(run: RunState, plan: Plan, node: Connector, backend: JobBackend) -> Result:
    fleet = _load_view(run, plan, node, backend)
    if fleet is None:
        return backend.tail(run, plan, node)
    host = node.host.name
    result: Result | None = None
    try:
        result = backend.tail(run, plan, node, _FleetFollower(run, fleet, host))
        # its shard's job, not detached by Ctrl-C: it ended
        if result.code != 130 and host in fleet.ours.get("tail", set()):
            rep = _record(
                run,
                node,
                plan,
                fleet,
                result.data.get("state") or "unknown",
                result.data.get("job_id"),
                {},
            )
            if rep is not None:
                result.data["shard"] = dict(fleet.shard(host) or {})
    finally:
        with fleet.lock:
            fleet.reported.setdefault("tail", set()).add(host)
            last = _claim_summary(run, fleet, "tail")
        if last:
            if fleet.attached:
                done = all(s.get("complete") for s in (fleet.doc or {}).get("shards", []))
                word = (
                    "succeeded"
                    if done
                    else "detached"
                    if run.interrupted.is_set()
                    else "unfinished"
                )
                run.emit(JobEnded("fleet", word))
            _summary(run, fleet, result)
    assert result is not None  # the backend returned (else its exception is on its way up)
    return result


def launch(run: RunState, plan: Plan, node: Connector, backend: JobBackend) -> Result:
    """`extract`, sharded across hosts when asked (--shards on a backend that shards by host); a
    backend that shards inside the host is handed --shards N, which must then be a number."""
    raw = plan.options.get("shards")
    if not backend.shards_by_host and (raw is True or str(raw).lower() == "all"):
        given = "--shards" if raw is True else f"--shards {raw}"
        return Result(
            node.host.name,
            "extract",
            Status.FAILED,
            f"{given} on {backend.host_words} needs the number "
            "of shards (the job array's size), e.g. --shards 4",
            code=EXIT_USAGE,
        )
    if raw in (None, False, "") or not backend.shards_by_host:
        return backend.launch(run, plan, node)
    return run_extract(run, plan, node, backend)
