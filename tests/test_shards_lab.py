"""Sharded extraction across SSH hosts on a 3-node lab of its own with the tiny model: `extract
--shards` gives shard i of 3 to the i-th host by name; a shard killed halfway resumes without
redoing a sample; the union of the shards equals a single-node run (same sample ids, hidden states
within 1e-5), no sample done twice; the fleet manifest on the laptop names host, rows, counts and
sha256s (checked against the nodes' files); status/tail print one aggregated line; a changed host
set is refused while shards are unfinished; fetch brings the shard manifests home."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from conftest import fab_json, run_fab
from faultkit import arm, disarm, hit_file
from hiddenstates import compare_to_reference
from polling import wait_for

pytestmark = pytest.mark.lab
HOSTS = ["lab01", "lab02", "lab03"]
TOTAL = 64
RANGES = {"lab01": (0, 21), "lab02": (21, 42), "lab03": (42, 64)}  # rows [i*64//3, (i+1)*64//3)


@pytest.fixture(scope="module")
def lab3(lab_factory):
    lab = lab_factory.shared(3, __name__)
    assert fab_json(lab.root, "-H", "@lab", "patch")[0] == 0
    yield lab
    run_fab(lab.root, "-H", "@lab", "stop", "--grace", "1")


def plan_of(lab) -> dict:
    return json.loads((lab.root / ".fleetops" / "shards" / "extract.json").read_text())


def shard_out(lab, host: str):
    i = HOSTS.index(host)
    return lab.node(host).state_dir / "hidden-states" / "shards" / f"output-{i}-of-3"


def test_option_refused_when_not_one_per_host(lab3):
    rc, doc = fab_json(lab3.root, "-H", "@lab", "extract", "--shards", "2")
    assert rc == 2, doc
    assert all("--shards 2 on 3 SSH hosts" in r["msg"] for r in doc["results"]), doc
    assert not (lab3.root / ".fleetops" / "shards" / "extract.json").exists()


def test_sharded_run_killed_shard_resumes_and_union_equals_single_node(lab3):
    lab = lab3
    # The reference: the whole dataset on one node (lab01), unsharded.
    proc = run_fab(lab.root, "-H", "lab01", "extract", "tail")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = lab.node("lab01").state_dir / "hidden-states"
    assert len(json.loads((reference / "manifest.json").read_text())["samples"]) == TOTAL

    # lab02's shard is SIGKILLed after its second batch of four.
    arm(lab.node("lab02"), {"extract.after_batch": {"action": "kill", "skip": 1}})
    try:
        rc, doc = fab_json(lab.root, "-H", "@lab", "extract", "--shards")
        assert rc == 0, doc
        by = {r["host"]: r for r in doc["results"]}
        for host, (start, end) in RANGES.items():
            i = HOSTS.index(host)
            assert by[host]["status"] == "changed", by[host]
            assert f"shard {i} of 3 (rows {start}-{end - 1} of 64" in by[host]["msg"], by[host][
                "msg"
            ]
        wait_for(
            lambda: hit_file(lab.node("lab02"), "extract.after_batch").exists(),
            "lab02's shard killed",
            300,
        )
    finally:
        disarm(lab.node("lab02"))
    wait_for(
        lambda: (
            fab_json(lab.root, "-H", "lab02", "status")[1]["results"][0]["data"]["state"]
            == "killed"
        ),
        "lab02's shard job to be seen killed",
        120,
    )
    first = json.loads((shard_out(lab, "lab02") / "manifest.json").read_text())
    assert len(first["samples"]) == 8, first["samples"].keys()
    stamps = {
        k: (shard_out(lab, "lab02") / v["file"]).stat().st_mtime_ns
        for k, v in first["samples"].items()
    }

    # A different host set while shards are unfinished: refused, nothing launched.
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "extract", "--shards")
    assert rc == 2, doc
    for r in doc["results"]:
        assert (
            "refused" in r["msg"]
            and "left out lab03" in r["msg"]
            and "are not finished" in r["msg"]
        ), r["msg"]

    # The same hosts again: lab02 resumes its own shard; the others are left alone (running or
    # complete).
    rc, doc = fab_json(lab.root, "-H", "@lab", "extract", "--shards")
    assert rc == 0, doc
    by = {r["host"]: r for r in doc["results"]}
    assert by["lab02"]["status"] == "changed" and "resuming at 8/21" in by["lab02"]["msg"], by[
        "lab02"
    ]
    for host in ("lab01", "lab03"):
        assert by[host]["status"] == "ok" and (
            "left alone" in by[host]["msg"] or "already complete" in by[host]["msg"]
        ), by[host]
    proc = run_fab(lab.root, "-H", "@lab", "tail", timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "fleet | fleet samples=64/64" in proc.stdout, proc.stdout[-3000:]
    assert "3/3 shards complete" in proc.stdout
    # While it streamed, the aggregated line with a bar: samples summed over the three shards, below
    # 64 at first.
    seen = [
        int(x)
        for x in re.findall(
            r"^fleet \| \[[#.]+\] .*fleet samples=(\d+)/64 tok/s=", proc.stdout, re.M
        )
    ]
    assert seen and min(seen) < 64, proc.stdout[-3000:]

    # Resumed, nothing redone: lab02's first 8 samples untouched, 13 more by run 1.
    final = json.loads((shard_out(lab, "lab02") / "manifest.json").read_text())
    assert sorted(int(k) for k in final["samples"]) == list(range(21))
    assert {
        k: (shard_out(lab, "lab02") / final["samples"][k]["file"]).stat().st_mtime_ns
        for k in stamps
    } == stamps
    assert sum(1 for s in final["samples"].values() if s["run"] == 1) == 13
    assert (
        "resuming: 8/21 samples already done"
        in (lab.node("lab02").state_dir / "jobs")
        .joinpath(final["runs"][1]["job"], "output.log")
        .read_text()
    )

    # The union: every row once, in order; global id = the shard's start + its local id.
    dataset = [
        ln
        for ln in (lab.node("lab01").state_dir / "lab-data" / "prompts.jsonl")
        .read_text()
        .splitlines()
        if ln.strip()
    ]
    rows, ids = [], []
    for host in HOSTS:
        start, end = RANGES[host]
        rows += (
            (shard_out(lab, host).parent / f"dataset-{HOSTS.index(host)}-of-3.jsonl")
            .read_text()
            .splitlines()
        )
        m = json.loads((shard_out(lab, host) / "manifest.json").read_text())
        assert m["total"] == end - start and len(m["samples"]) == end - start
        ids += [start + int(k) for k in m["samples"]]
    assert rows == dataset
    # no sample twice, none missing
    assert sorted(ids) == list(range(TOTAL)) and len(set(ids)) == TOTAL

    # The fleet manifest on the laptop: hosts, rows, counts, sha256 of each shard's manifest and
    # samples, recomputed here from the nodes' files.
    doc = plan_of(lab)
    assert doc["hosts"] == HOSTS and doc["complete"] is True and doc["dataset"]["rows"] == TOTAL
    for s in doc["shards"]:
        out = shard_out(lab, s["host"])
        assert (s["start"], s["end"]) == RANGES[s["host"]] and s["samples"] == s["done"] == s[
            "end"
        ] - s["start"]
        assert (
            s["manifest_sha256"] == hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
        )
        m = json.loads((out / "manifest.json").read_text())
        digest = hashlib.sha256()
        for k in sorted(m["samples"], key=int):
            f = m["samples"][k]["file"]
            digest.update(
                f"{int(k)} {f} {hashlib.sha256((out / f).read_bytes()).hexdigest()}\n".encode()
            )
        assert s["samples_sha256"] == digest.hexdigest()
    assert len(doc["shards"][1]["jobs"]) == 2  # lab02: the killed job and the resumed one

    # The same hidden states as the single-node run.
    pairs = [(str(shard_out(lab, h)), RANGES[h][0]) for h in HOSTS]
    result = compare_to_reference(reference, pairs)
    assert result["checked"] == TOTAL and result["worst"] < 1e-5, result

    # Fleet-wide status: per-host lines plus the aggregated one (in --json: the last host's
    # data["fleet"]).
    rc, doc = fab_json(lab.root, "-H", "@lab", "status")
    assert rc == 0, doc
    fleet = [r["data"]["fleet"] for r in doc["results"] if "fleet" in r["data"]]
    assert len(fleet) == 1 and fleet[0]["done"] == TOTAL and fleet[0]["total"] == TOTAL, fleet
    proc = run_fab(lab.root, "-H", "@lab", "status")
    assert "fleet | fleet samples=64/64" in proc.stdout and proc.stdout.count("shard ") >= 3, (
        proc.stdout
    )

    # fetch brings each host's shard manifest home, byte for byte.
    dest = lab.root / "fetched-shards"
    rc, doc = fab_json(lab.root, "-H", "@lab", "fetch", "--dest", str(dest))
    assert rc == 0, doc
    for r in doc["results"]:
        got = dest / r["host"] / r["data"]["job_id"] / "manifest.json"
        assert got.read_bytes() == (shard_out(lab, r["host"]) / "manifest.json").read_bytes()

    # A finished plan gives way: another host set is accepted now (a new plan), stopped fleet-wide.
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "extract", "--shards", "all")
    assert rc == 0, doc
    assert plan_of(lab)["hosts"] == ["lab01", "lab02"]
    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "stop", "--grace", "1")
    assert rc == 0 and all(r["status"] in ("changed", "ok") for r in doc["results"]), doc


def test_plan_units(tmp_path):
    """The pure parts (fleetops/plans/shards.py): what --shards means, the split, the plan's
    decisions, the sums."""
    from fleetops.plans import shards as shardplan

    assert [shardplan.count(x, 3) for x in (None, True, "", "all", "3")] == [3] * 5
    for bad in ("2", "4", "x"):
        with pytest.raises(shardplan.ShardError, match="one shard per selected host"):
            shardplan.count(bad, 3)
    assert shardplan.order(["lab10", "lab2", "lab1"]) == ["lab1", "lab2", "lab10"]
    for rows in (0, 1, 2, 64, 1001):
        for of in (1, 2, 3, 7):
            spans = [shardplan.rows_of(i, of, rows) for i in range(of)]
            assert [r for a, b in spans for r in range(a, b)] == list(range(rows))
    path = tmp_path / "extract.json"
    doc, how = shardplan.decide(None, "extract", ["b", "a"], "t0", path)
    assert (
        how == "new"
        and doc["hosts"] == ["a", "b"]
        and [s["host"] for s in doc["shards"]] == ["a", "b"]
    )
    assert shardplan.decide(doc, "extract", ["a", "b"], "t1", path) == (doc, "resumed")
    with pytest.raises(
        shardplan.ShardError,
        match=r"not finished.*added c; left out b.*fab -H a,b extract --shards",
    ):
        shardplan.decide(doc, "extract", ["a", "c"], "t1", path)
    for s in doc["shards"]:
        s["complete"] = True
    assert shardplan.decide(doc, "extract", ["a", "c"], "t1", path)[1] == "replaced"
    shardplan.save(path, doc)
    assert shardplan.load(path) == json.loads(json.dumps(doc))
    path.write_text("{not json")
    with pytest.raises(shardplan.ShardError, match="not JSON"):
        shardplan.load(path)
    agg = shardplan.aggregate(
        [
            {"host": "a", "done": 10, "total": 21, "tok_s": 100.0, "eta": 5.0, "state": "running"},
            {"host": "b", "done": 21, "total": 21, "tok_s": 80.0, "eta": 0.0, "state": "succeeded"},
            {"host": "c", "done": 3, "total": 22, "tok_s": 50.5, "eta": 40.0, "state": "running"},
        ]
    )
    assert (agg["done"], agg["total"], agg["tok_s"], agg["eta"], agg["slowest"]) == (
        34,
        64,
        150.5,
        40.0,
        "c",
    )
    assert shardplan.line(agg).startswith("fleet samples=34/64 tok/s=150.5 eta=40.0s")
