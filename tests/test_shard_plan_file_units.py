"""The fleet's shard plan file (<project>/.fleetops/shards/<job>.json) under the threads of one run:
every host's step of every task in the run updates one plan, and a save never loses or tears
another's update. Found by CI: `extract --shards all tail` on two hosts left lab02's shard without
its sample count ("32/None samples") when lab01's tail, holding a copy read before lab02's extract
recorded it, wrote the plan back."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from fleetops.plans import shards as shardplan
from fleetops.state import RunState
from fleetops.tasks.jobs.shards import _fleet
from fleetops.tasks.plan import Plan


def _plan(op: str) -> Plan:
    return Plan(op, {}, 60.0, None, options={"job": "extract"})


def test_every_step_of_a_run_shares_one_plan(tmp_path: Path) -> None:
    run = RunState(tmp_path, {})
    extract, tail = _plan("extract"), _plan("tail")
    mine = _fleet(run, extract)
    mine.doc, _ = shardplan.decide(None, "extract", ["lab01", "lab02"], "now", mine.path)
    mine.save()

    # lab02's extract records its preparation through the extract step's view ...
    mine.shard("lab02").update(samples=32, start=32, end=64)  # type: ignore[union-attr]
    mine.save()
    # ... while lab01's tail, in the same run, saves through its own step's view
    theirs = _fleet(run, tail)
    theirs.shard("lab01").update(done=32)  # type: ignore[union-attr]
    theirs.save()

    on_disk = shardplan.load(mine.path)
    assert on_disk is not None
    by_host = {s["host"]: s for s in on_disk["shards"]}
    assert by_host["lab02"]["samples"] == 32 and by_host["lab01"]["done"] == 32, by_host


def test_another_job_has_its_own_plan(tmp_path: Path) -> None:
    run = RunState(tmp_path, {})
    other = Plan("extract", {}, 60.0, None, options={"job": "extract-small"})
    assert _fleet(run, _plan("extract")) is not _fleet(run, other)
    assert _fleet(run, other).path.name == "extract-small.json"


def test_saves_from_many_threads_never_tear_or_fail(tmp_path: Path) -> None:
    path = tmp_path / ".fleetops" / "shards" / "extract.json"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait()
        for i in range(200):
            try:
                shardplan.save(path, {"writer": n, "i": i, "pad": "x" * 4096})
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["pad"] == "x" * 4096 and doc["i"] == 199
    assert [p.name for p in path.parent.iterdir()] == ["extract.json"]  # no temp file left
