"""The client/node wire contract, in one place (stdlib only): both fleetops (client) and the node
agent import it. Change the contract here and bump PROTOCOL; a mismatched pair refuses to talk."""

from __future__ import annotations

# A request carries it; the agent refuses any other (see agent.main).
PROTOCOL = 2

# Every op the agent answers. ping is built in; each other is declared by its module
# (registry.node_op), which the manifest (remote_scripts/ops.py) names.
OPS = (
    "ping",
    "patch",
    "rollback",
    "verify",
    "gpu",
    "facts",
    "preflight",
    "job_start",
    "job_status",
    "job_tail",
    "job_logs",
    "job_stop",
    "run",
    "jobs_list",
    "fetch_plan",
    "diagnose",
    "capture",
    "slurm",
    "shards",
    "drain",
    "undrain",
    "schedule",
)

# Ops that change nothing on the node (they read files, /proc, nvidia-smi, a job's logs): the one
# list of them. The client may send one before the previous request's answer is in (pipelining): if
# that earlier step fails, the read-only one has run for nothing and its answer is dropped; nothing
# else happened. Never add an op that writes (patch, rollback, job_start, job_stop, run, capture,
# fetch_plan, ...): its module's declaration (`writes=True`) is refused while this set names it.
READ_ONLY_OPS = frozenset(
    {
        "ping",
        "verify",
        "gpu",
        "facts",
        "job_status",
        "job_logs",
        "job_tail",
        "jobs_list",
        "diagnose",
    }
)
assert set(OPS) >= READ_ONLY_OPS

# The kinds of check a playbook's verify: may name ("requires" is added from the playbook's
# requires:).
CHECK_KINDS = ("requires", "grep", "compile", "import", "callsites", "probe")

# Status words of patch/rollback items (remote_scripts/patch/patching.py writes them,
# fleetops/tasks/patching.py reads them).
APPLIED = "applied"
RESTORED = "restored"
WOULD_APPLY = "would_apply"
WOULD_RESTORE = "would_restore"
ALREADY_APPLIED = "already_applied"
ALREADY_ORIGINAL = "already_original"
# the node's packages do not meet the playbook's requires: (the client's verdict), or a
REFUSED = "refused"
# module is not installed
DRIFTED = "drifted"  # the file matches neither form: nothing written
FAILED = "failed"  # an OS error, or a backup that does not match its record: the file is unchanged
NOT_WRITTEN = "not_written"  # another file of the set stopped it: a set is all-or-nothing per host
CHANGED_WORDS = frozenset({APPLIED, RESTORED})
WOULD_WORDS = frozenset({WOULD_APPLY, WOULD_RESTORE})
NOOP_WORDS = frozenset({ALREADY_APPLIED, ALREADY_ORIGINAL})


# ASCII letters and digits: str.isalnum() would also take other scripts' letters
ASCII_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
