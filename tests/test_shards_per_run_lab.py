"""Shard state belongs to the sharded run, on real lab nodes with the tiny model: after `extract
--shards all` on two nodes, a later plain `extract` on one of them is that node's own job; its
`status` and `tail` say nothing of the shard plan (no "shard i of N", no fleet line), while the
other node, whose latest job is still its shard's, keeps the shard view."""

from __future__ import annotations

import subprocess

import pytest
from conftest import fab_json, run_fab

pytestmark = pytest.mark.lab


@pytest.fixture
def fresh(lab):
    for node in lab.nodes():
        subprocess.run(
            ["rm", "-rf", str(node.state_dir / "hidden-states"), str(node.state_dir / "jobs")],
            check=True,
        )
    yield lab
    run_fab(lab.root, "-H", "lab01,lab02", "stop", "--grace", "1")


def test_a_later_plain_extract_is_not_reported_as_a_shard(fresh):
    lab = fresh
    sharded = run_fab(
        lab.root, "-H", "lab01,lab02", "patch", "extract", "--shards", "all", "tail", timeout=900
    )
    assert sharded.returncode == 0, sharded.stdout[-3000:] + sharded.stderr
    assert "2/2 shards complete" in sharded.stdout, sharded.stdout[-3000:]
    rc, doc = fab_json(lab.root, "-H", "lab01", "status")
    assert rc == 0 and doc["results"][0]["msg"].startswith(
        "shard 0 of 2 (32/32 samples, complete)"
    ), doc

    # the whole dataset, on lab01 alone
    later = run_fab(lab.root, "-H", "lab01", "extract", "tail", timeout=900)
    assert later.returncode == 0, later.stdout[-3000:] + later.stderr
    # its tail: this job's lines, no shard aggregate
    assert "fleet |" not in later.stdout, later.stdout[-3000:]
    rc, doc = fab_json(lab.root, "-H", "lab01", "status")
    res = doc["results"][0]
    assert rc == 0 and res["msg"].startswith("job extract-") and "shard" not in res["msg"], res
    assert "shard" not in res["data"] and "fleet" not in res["data"], res["data"]
    proc = run_fab(lab.root, "-H", "lab01", "status")
    assert "fleet |" not in proc.stdout and "shard" not in proc.stdout, proc.stdout

    rc, doc = fab_json(lab.root, "-H", "lab01,lab02", "status")
    by = {r["host"]: r for r in doc["results"]}
    assert "shard" not in by["lab01"]["msg"], by["lab01"]
    assert by["lab02"]["msg"].startswith("shard 1 of 2 (32/32 samples, complete)"), by["lab02"]
