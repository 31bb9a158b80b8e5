"""A job backend added by registering it, no table edited: a tiny read-only backend claims one real
lab node, and `status` and `jobs` on that node go through it while the other node keeps the SSH
backend."""

from __future__ import annotations

import pytest

from fleetops import api
from fleetops.plans.host import Host
from fleetops.results import EXIT_FAILED, Result, Status
from fleetops.tasks.jobs import JobBackend, TailFollower, register, unregister

pytestmark = pytest.mark.lab


class ReadOnlyJobs(JobBackend):
    """Reads the node's jobs with the agent's own read-only ops; launches, follows and stops
    nothing."""

    scheduler = "read-only-in-a-test"

    def __init__(self, host: str) -> None:
        self.host = host
        self.asked: list[str] = []

    def handles(self, host: Host) -> bool:
        return host.name == self.host

    def status(self, run, plan, node) -> Result:  # type: ignore[no-untyped-def]
        self.asked.append("status")
        answer, _ = node.call("job_status", {"job_id": plan.options.get("job_id")})
        said = answer.get("error") or f"job {answer['job']['id']} {answer['state']}"
        return Result(
            node.host.name, "status", Status.OK, f"read-only: {said}", data={"backend": "read-only"}
        )

    def list(self, run, plan, node) -> Result:  # type: ignore[no-untyped-def]
        self.asked.append("jobs")
        # the node's own listing, read as every backend reads it
        result = super().list(run, plan, node)
        result.msg = f"read-only: {result.msg}"
        return result

    def _refused(self, node, task: str) -> Result:  # type: ignore[no-untyped-def]
        self.asked.append(task)
        return Result(
            node.host.name,
            task,
            Status.FAILED,
            f"{task}: this backend only reads",
            code=EXIT_FAILED,
        )

    def launch(self, run, plan, node) -> Result:  # type: ignore[no-untyped-def]
        return self._refused(node, "extract")

    def tail(  # type: ignore[no-untyped-def]
        self, run, plan, node, follow: TailFollower | None = None
    ) -> Result:
        return self._refused(node, "tail")

    def logs(self, run, plan, node) -> Result:  # type: ignore[no-untyped-def]
        return self._refused(node, "logs")

    def stop(self, run, plan, node) -> Result:  # type: ignore[no-untyped-def]
        return self._refused(node, "stop")


def test_a_registered_backend_answers_status_and_jobs_on_its_node_only(lab):
    backend = register(ReadOnlyJobs("lab01"))
    try:  # one task a run: a step that fails on a node with no job would end that node's chain
        results = [
            r
            for task in ("status", "jobs")
            for r in api.run(lab.root, ["lab01", "lab02"], [(task, {})])
        ]
        results += api.run(lab.root, "lab01", [("extract", {})])
    finally:
        unregister(backend)
    by = {(r.host, r.task): r for r in results}
    assert backend.asked == ["status", "jobs", "extract"]
    mine = by[("lab01", "status")]
    assert mine.msg.startswith("read-only: ") and mine.data["backend"] == "read-only", mine
    listed = by[("lab01", "jobs")]
    assert listed.msg.startswith("read-only: ") and "jobs" in listed.data, listed
    refused = by[("lab01", "extract")]
    assert refused.status is Status.FAILED and refused.msg == "extract: this backend only reads", (
        refused
    )
    # The other node's jobs are the SSH backend's, as before; nothing of lab01's answers came from
    # there.
    for task in ("status", "jobs"):
        other = by.get(("lab02", task))
        assert other is not None and not other.msg.startswith("read-only"), (task, other)
    # Unregistered: lab01's jobs are the SSH backend's again.
    again = api.run(lab.root, "lab01", [("jobs", {})])
    assert not again[0].msg.startswith("read-only") and backend.asked == [
        "status",
        "jobs",
        "extract",
    ]
