"""Slurm's output parsed (fleetops/plans/slurm.py) on output recorded from a real Slurm 22.05.8
(tests/fixtures/slurm/, how each was made is in its README), the inventory's Slurm fields, and the
batch script the node writes (remote_scripts/jobs/slurm.py). No daemons here:
tests/test_slurm_lab.py runs the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetops.plans import slurm as sp
from fleetops.plans.inventory import load_inventory
from fleetops.plans.yamlsrc import ConfigError
from fleetops.tasks.jobs.slurm.view import tasks_view

FIX = Path(__file__).parent / "fixtures" / "slurm"


def text(name: str) -> str:
    """A capture; the trailing `rc=N` line some of them carry was added by the capture, not the
    tool."""
    return "\n".join(ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("rc="))


def test_sbatch_parsable_ids_and_refusals():
    assert sp.parse_sbatch(text("sbatch_parsable_blocker.txt")) == "1"
    assert sp.parse_sbatch(text("sbatch_parsable_array.txt")) == "2"
    assert sp.parse_sbatch("77;clusterA\n") == "77"  # --parsable on a multi-cluster setup
    with pytest.raises(sp.SlurmParseError, match="Invalid partition"):
        sp.parse_sbatch(text("sbatch_bad_partition.txt"))


def test_squeue_pending_array_tasks_each_on_their_own_line_with_reason():
    rows = sp.parse_squeue(text("squeue_pending.txt"))
    by_id = {r.job_id: r for r in rows}
    assert set(by_id) == {"2_0", "2_1"}
    assert [(by_id["2_0"].task, by_id["2_0"].word, by_id["2_0"].reason) for _ in [0]] == [
        (0, "pending", "Resources")
    ]
    assert by_id["2_1"].task == 1 and by_id["2_1"].extra["gres"] == "gres:gpu:1"
    assert (by_id["2_1"].user, by_id["2_1"].name, by_id["2_1"].submit) == (
        "root",
        "extract-x",
        "2026-12-02T04:48:57",
    )


def test_squeue_running_and_after_one_task_cancelled():
    running = {r.job_id: r for r in sp.parse_squeue(text("squeue_running.txt"))}
    assert [(r.word, r.nodes) for _, r in sorted(running.items())] == [
        ("running", "vm"),
        ("running", "vm"),
    ]
    assert running["2_0"].extra["job_id"] == "3"  # task 0 got its own job id when it started
    after = {r.job_id: r.word for r in sp.parse_squeue(text("squeue_after_cancel_one.txt"))}
    # --states=all: the cancelled task is still listed
    assert after == {"2_0": "running", "2_1": "cancelled"}


def test_squeue_bad_line_is_an_error_not_a_guess():
    with pytest.raises(sp.SlurmParseError, match="fields"):
        sp.parse_squeue("2_0|RUNNING\n")


def test_the_node_and_the_client_read_squeues_lines_alike():
    """One line split on both sides: the same fields of every line, a `|` in a job's name kept in
    the name; a line short of fields is left out by the node and an error on the client."""
    from remote_scripts.jobs import slurmquery as node_query

    for name in ("squeue_failed_injected.txt", "squeue_running.txt", "squeue_reused.txt"):
        text = (FIX / name).read_text()
        parsed = sp.parse_squeue(text)
        assert [(r["id"], r["state"], r["name"]) for r in node_query.rows(text)] == [
            (st.job_id, st.state, st.name) for st in parsed
        ]
    (injected,) = sp.parse_squeue((FIX / "squeue_failed_injected.txt").read_text())
    assert (injected.state, injected.name) == ("FAILED", "evil|0|COMPLETED|x")
    assert node_query.rows("2_0|RUNNING\n") == []
    assert sp.parse_restarts((FIX / "squeue_restarts.txt").read_text()) == {"3_1": 1, "3_0": 0}
    assert node_query.restart_counts("3_[0-7%2] 4\n") == {"3_[0-7%2]": 4}
    assert sp.parse_restarts("3_[0-7%2] 4\n") == {}  # not one job's id: no count for the client


def test_squeue_cancelled_and_failed_jobs_keep_their_final_state():
    cancelled = {r.task: r for r in sp.parse_squeue(text("squeue_cancelled.txt"))}
    assert cancelled[0].word == cancelled[1].word == "cancelled"
    (failed,) = sp.parse_squeue(text("squeue_failed_injected.txt"))
    assert (failed.word, failed.reason, failed.nodes, failed.exit_code) == (
        "failed",
        "NonZeroExitCode",
        "vm",
        None,
    )


def test_sacct_disabled_is_recognised_and_sacct_lines_parse():
    assert sp.sacct_disabled(text("sacct_disabled.txt"), "")
    # Not recorded here (this cluster has no accounting): the field layout of --parsable2 with
    # SACCT_FORMAT, in the shape sacct prints (steps on their own lines, "CANCELLED by UID").
    out = (
        "12_0|COMPLETED|0:0|gpu01|00:01:02|2026-11-30T10:00:00|2026-11-30T10:01:02|ops|"
        "2026-11-30T09:59:00|extract\n"
        "12_0.batch|COMPLETED|0:0|gpu01|00:01:02|2026-11-30T10:00:00|2026-11-30T10:01:02||"
        "2026-11-30T09:59:00|batch\n12_1|CANCELLED by "
        "0|0:15|gpu02|00:00:30|2026-11-30T10:00:00|2026-11-30T10:00:30|ops|2026-11-30T09:59:00|"
        "extract\n"
    )
    rows = sp.parse_sacct(out)
    assert [(r.task, r.word, r.nodes, r.user) for r in rows] == [
        (0, "succeeded", "gpu01", "ops"),
        (1, "cancelled", "gpu02", "ops"),
    ]


def test_state_words_and_the_jobs_overall_word():
    assert [
        sp.state_word(s)
        for s in (
            "PENDING",
            "CONFIGURING",
            "COMPLETING",
            "COMPLETED",
            "CANCELLED+",
            "TIMEOUT",
            "OUT_OF_MEMORY",
            "NODE_FAIL",
            "WHATEVER",
        )
    ] == [
        "pending",
        "running",
        "running",
        "succeeded",
        "cancelled",
        "failed",
        "failed",
        "failed",
        "unknown",
    ]
    assert sp.overall(["succeeded", "running"]) == "running"
    assert sp.overall(["succeeded", "pending"]) == "pending"
    assert sp.overall(["succeeded", "cancelled"]) == "cancelled"
    assert sp.overall(["failed", "killed"]) == "killed"
    assert sp.overall(["succeeded", "succeeded"]) == "succeeded"


def raw(stdout: str = "", rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def test_tasks_view_prefers_squeue_then_the_exit_file():
    job = {
        "id": "extract-1",
        "shards": 2,
        "slurm_job_id": "2",
        "name": "extract-x",
        "slurm_user": "root",
        "slurm_submit": "2026-12-02T04:48:57",
    }
    answer = {
        "job": job,
        "query": {
            "squeue": raw(text("squeue_after_cancel_one.txt")),
            "sacct": raw(text("sacct_disabled.txt"), 1),
        },
        "exits": {},
    }
    rows = tasks_view(answer)
    assert [(r["task"], r["state"], r["source"]) for r in rows] == [
        (0, "running", "squeue"),
        (1, "cancelled", "squeue"),
    ]
    assert rows[1]["signal"] is None  # squeue says CANCELLED, not which signal: none is made up
    assert any("accounting storage is disabled" in n for n in rows[0]["notes"])
    # Past MinJobAge with no accounting: only the batch script's exit file knows.
    gone = {
        "job": job,
        "query": {
            "squeue": raw("", 1, text("squeue_unknown.txt")),
            "sacct": raw(text("sacct_disabled.txt"), 1),
        },
        "exits": {"0": {"exit_code": 0, "signal": None}},
    }
    rows = tasks_view(gone)
    assert [(r["state"], r["source"]) for r in rows] == [
        ("succeeded", "exit-file"),
        ("unknown", "none"),
    ]


def test_inventory_slurm_fields_and_refusals(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n  login01:\n    address: 127.0.0.1\n    scheduler: slurm\n    partition: gpu\n"
        "    account: proj-42\n    gres: gpu:h200:8\n    time_limit: 1-00:00:00\n  plain:\n"
        "    address: 127.0.0.2\n"
    )
    inv = load_inventory(hosts)
    login = inv.hosts["login01"]
    assert (login.scheduler, login.partition, login.account, login.gres, login.time_limit) == (
        "slurm",
        "gpu",
        "proj-42",
        "gpu:h200:8",
        "1-00:00:00",
    )
    assert inv.hosts["plain"].scheduler is None
    for key, value in (
        ("scheduler", "pbs"),
        ("partition", "gpu;rm -rf"),
        ("gres", "gpu:$(id)"),
        ("time_limit", "1 day"),
        ("account", "--uid=0"),
    ):
        hosts.write_text(f'hosts:\n  login01:\n    address: 127.0.0.1\n    {key}: "{value}"\n')
        with pytest.raises(ConfigError) as err:
            load_inventory(hosts)
        assert f"{hosts}:4" in str(err.value) and key in str(err.value)
    hosts.write_text("hosts:\n  plain:\n    address: 127.0.0.1\n    gres: gpu:8\n")
    with pytest.raises(
        ConfigError, match=r"hosts.yaml:4.*'gres' is a Slurm setting; add 'scheduler: slurm'"
    ):
        load_inventory(hosts)


def test_batch_script_is_the_bootstraps_fixed_text_that_compiles():
    from fleetops.wire.bundle import BOOTSTRAP
    from remote_scripts.jobs import slurmquery as node_query
    from remote_scripts.jobs import slurmstep

    # the batch script is the verifying bootstrap itself under a `#!python -IS` line (its arguments
    # name the state dir, the agent, its sha256 and the step's role): no user data in its text
    compile(BOOTSTRAP, "batch.py", "exec")
    assert slurmstep.STEP == "slurm-step"
    # a field named for each one asked for, the free-text name last (the line split keeps a `|` in
    # it); a job waits in the queue in a state the queue counts
    assert sp.SQUEUE_FORMAT.count("|") + 1 == len(sp.SQUEUE_FIELDS) == len(set(sp.SQUEUE_FIELDS))
    assert sp.SQUEUE_FORMAT.endswith("|%j") and sp.SQUEUE_FIELDS[-1] == "name"
    assert sp.SACCT_FORMAT.split(",")[-1] == "JobName"
    assert node_query.WAITING <= sp.PENDING and not sp.RUNNING & sp.PENDING


def _slurm_job(state_dir: Path, lines: list[int], ended: bool = True) -> str:
    """A job as remote_scripts/jobs/slurm.py lays it out, one task per entry of `lines` (task i
    wrote lines[i] lines), never submitted (no Slurm id: no scheduler queried), each task's exit
    file written when `ended`."""
    job_id = "numbers-20261130T000000-abcd"
    job_dir = state_dir / "slurm" / job_id
    job_dir.mkdir(parents=True)
    logs = []
    for task, n in enumerate(lines):
        log = job_dir / f"task-{task}.log"
        log.write_text("".join(f"task {task} line {i}\n" for i in range(n)))
        logs.append(str(log))
        if ended:
            (job_dir / f"exit-{task}.json").write_text(
                json.dumps({"exit_code": 0, "signal": None, "task": task})
            )
    (job_dir / "job.json").write_text(
        json.dumps(
            {
                "id": job_id,
                "name": "numbers",
                "kind": "command",
                "shards": len(lines),
                "logs": logs,
                "slurm_job_id": None,
            }
        )
    )
    (state_dir / "slurm" / "current.json").write_text(json.dumps({"id": job_id}))
    return job_id


def _node_tail(state_dir: Path, **req) -> dict:
    from remote_scripts.jobs import slurm as node_slurm

    return node_slurm.tail({"state_dir": str(state_dir), "wait_s": 0, **req})


def test_node_tail_attach_starts_each_task_at_its_last_lines_and_says_what_it_skipped(tmp_path):
    _slurm_job(tmp_path, [30, 5])
    # attaching, no line count: the last 20 whole lines of each task
    first = _node_tail(tmp_path, offsets=None)
    assert first["data"][0].splitlines() == [f"task 0 line {i}" for i in range(10, 30)]
    assert first["data"][1].splitlines() == [f"task 1 line {i}" for i in range(5)]
    skipped_bytes = len("".join(f"task 0 line {i}\n" for i in range(10)))
    assert first["skipped"] == [
        {"offset": skipped_bytes, "skipped_bytes": skipped_bytes, "skipped_lines": 10},
        {"offset": 0, "skipped_bytes": 0, "skipped_lines": 0},
    ]
    assert first["offsets"] == [skipped_bytes, 0]
    three = _node_tail(tmp_path, offsets=None, last_lines=3)
    assert [d.splitlines()[0] for d in three["data"]] == ["task 0 line 27", "task 1 line 2"]
    assert [s["skipped_lines"] for s in three["skipped"]] == [27, 2]
    replay = _node_tail(tmp_path, offsets=None, from_start=True)
    assert replay["offsets"] == [0, 0] and replay["data"][0].splitlines()[0] == "task 0 line 0"
    assert [s["skipped_bytes"] for s in replay["skipped"]] == [0, 0]
    # Following (offsets given): exactly from there, nothing skipped.
    follow = _node_tail(tmp_path, offsets=first["next_offsets"])
    assert follow["data"] == ["", ""] and follow["skipped"] == []


def test_node_tail_attach_to_a_running_task_counts_whole_lines_only(tmp_path):
    job_id = _slurm_job(tmp_path, [25], ended=False)
    log = tmp_path / "slurm" / job_id / "task-0.log"
    with log.open("a") as f:
        f.write("task 0 half a li")  # still being written: neither shown nor counted as a line yet
    got = _node_tail(tmp_path, offsets=None, last_lines=4)
    assert got["data"][0].splitlines() == [f"task 0 line {i}" for i in range(21, 25)]
    assert got["skipped"][0]["skipped_lines"] == 21


class _NodeOverFiles:
    """A connector whose `slurm` op is the node's own code on a local state dir (no SSH, no
    Slurm)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir, self.requests = state_dir, []
        self.host = SimpleNamespace(name="login01", env_values=(), groups=[], scheduler="slurm")

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, None]:
        from remote_scripts.jobs import slurm as node_slurm

        assert op == "slurm" and request["action"] == "tail"
        self.requests.append(request)
        return node_slurm.tail({**request, "state_dir": str(self.state_dir), "wait_s": 0}), None

    def close(self) -> None:
        pass


def _client_tail(
    tmp_path: Path, options: dict, launched: str | None = None
) -> tuple[list[str], list[dict], object]:
    from fleetops.state import RunState
    from fleetops.tasks.jobs.slurm.jobs import run_tail
    from fleetops.tasks.plan import Plan

    run = RunState(tmp_path / "project", {})
    shown: list[str] = []
    run.reporter.note = lambda message: shown.append(message)
    run.reporter.job_line = lambda label, line, failed, progress: shown.append(f"{label} | {line}")
    if launched:
        run.launched["login01"] = launched
    node = _NodeOverFiles(tmp_path)
    result = run_tail(run, Plan("tail", {}, 60, None, options=options), node)
    return shown, node.requests, result


def test_client_tail_reattach_shows_last_lines_per_task_with_a_note_and_extract_tail_replays(
    tmp_path,
):
    job_id = _slurm_job(tmp_path, [30, 22])
    shown, requests, result = _client_tail(tmp_path, {})
    assert (
        requests[0]["offsets"] is None
        and requests[0]["last_lines"] is None
        and not requests[0]["from_start"]
    )
    assert [ln for ln in shown if ln.startswith("login01[0] | task")] == [
        f"login01[0] | task 0 line {i}" for i in range(10, 30)
    ]
    assert [ln for ln in shown if ln.startswith("login01[1] | task")] == [
        f"login01[1] | task 1 line {i}" for i in range(2, 22)
    ]
    notes = [ln for ln in shown if "earlier lines not shown" in ln]
    assert len(notes) == 2 and notes[0].startswith(
        f"login01[0] | job {job_id}: 10 earlier lines not shown ("
    )
    assert notes[1].startswith(f"login01[1] | job {job_id}: 2 earlier lines not shown (")
    assert notes[0].endswith("bytes); --from-start replays them") and result.code == 0
    # `extract tail` in one command: this run submitted the job, so its tail starts at the first
    # line.
    shown, requests, _ = _client_tail(tmp_path, {}, launched=job_id)
    assert requests[0]["from_start"] is True and requests[0]["job_id"] == job_id
    assert not any("earlier lines not shown" in ln for ln in shown)
    assert shown.count("login01[0] | task 0 line 0") == 1 and "login01[1] | task 1 line 0" in shown
    # --lines wins over the run's own launch; --from-start replays a job launched by an earlier
    # command.
    shown, requests, _ = _client_tail(tmp_path, {"lines": "2"}, launched=job_id)
    assert requests[0]["last_lines"] == 2 and not requests[0]["from_start"]
    assert [ln for ln in shown if "| task 0" in ln] == [
        "login01[0] | task 0 line 28",
        "login01[0] | task 0 line 29",
    ]
    shown, requests, _ = _client_tail(tmp_path, {"from_start": True})
    assert requests[0]["from_start"] is True and "login01[0] | task 0 line 0" in shown
    # following: offsets only
    assert len(requests) >= 2 and all("last_lines" not in r for r in requests[1:])
    _, _, bad = _client_tail(tmp_path, {"lines": "many"})
    assert bad.code == 2 and "not a number of lines" in bad.msg
