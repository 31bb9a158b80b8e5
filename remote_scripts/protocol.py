"""The client/node wire contract, in one place (stdlib only): both fleetops (client) and the node agent
import it. Change the contract here and bump PROTOCOL; a mismatched pair refuses to talk."""

from __future__ import annotations

import re

# A request carries it; the agent refuses any other (see agent.main).
PROTOCOL = 1

# Every op the agent answers. ping is built in; the others name (module, function) in agent.OPS.
OPS = ("ping", "patch", "rollback", "verify", "gpu", "facts", "preflight", "job_start", "job_status", "job_tail",
       "job_logs", "job_stop", "run", "jobs_list", "fetch_plan", "diagnose", "capture", "slurm", "shards")

# Ops that change nothing on the node (they read files, /proc, nvidia-smi, a job's logs): the one list of
# them. The client may send one before the previous request's answer is in (pipelining, issue 16): if that
# earlier step fails, the read-only one has run for nothing and its answer is dropped; nothing else happened.
# Never add an op that writes (patch, rollback, job_start, job_stop, run, capture, fetch_plan, ...).
READ_ONLY_OPS = frozenset({"ping", "verify", "gpu", "facts", "job_status", "job_logs", "job_tail", "jobs_list",
                           "diagnose"})
assert set(OPS) >= READ_ONLY_OPS

# The kinds of check a playbook's verify: may name ("requires" is added from the playbook's requires:).
CHECK_KINDS = ("requires", "grep", "compile", "import", "callsites", "probe")

# Status words of patch/rollback items (remote_scripts/patching.py writes them, fleetops/tasks/patching.py
# reads them).
APPLIED = "applied"
RESTORED = "restored"
WOULD_APPLY = "would_apply"
WOULD_RESTORE = "would_restore"
ALREADY_APPLIED = "already_applied"
ALREADY_ORIGINAL = "already_original"
REFUSED = "refused"  # the node's packages do not meet the playbook's requires:, or a module is not installed
DRIFTED = "drifted"  # the file matches neither form: nothing written
FAILED = "failed"  # an OS error, or a backup that does not match its record: the file is unchanged
NOT_WRITTEN = "not_written"  # another file of the set stopped it: a set is all-or-nothing per host
CHANGED_WORDS = frozenset({APPLIED, RESTORED})
WOULD_WORDS = frozenset({WOULD_APPLY, WOULD_RESTORE})
NOOP_WORDS = frozenset({ALREADY_APPLIED, ALREADY_ORIGINAL})


# ---------------------------------------------------------------- requirements ("vllm==0.16.*")
_REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)")
_CLAUSE = re.compile(r"\s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)\s*")


def parse_requirement(text: str) -> tuple[str, list[tuple[str, str]]]:
    m = _REQ.fullmatch(text)
    if not m:
        raise ValueError(f"not a requirement: {text!r}")
    name, rest = m.group(1), m.group(2).strip()
    clauses = []
    if rest:
        for part in rest.split(","):
            cm = _CLAUSE.fullmatch(part)
            if not cm:
                raise ValueError(f"bad version clause {part.strip()!r} in {text!r}")
            op, ver = cm.groups()
            if "*" in ver and (op not in ("==", "!=") or not ver.endswith(".*") or "*" in ver[:-2]):
                raise ValueError(f"wildcard only allowed as '==X.*' or '!=X.*' in {text!r}")
            clauses.append((op, ver))
    return name, clauses


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"(\d+(?:\.\d+)*)", version.split("+", 1)[0])
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def _padded(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def version_matches(version: str, clauses: list[tuple[str, str]]) -> bool:
    have = _release(version)
    for op, want_text in clauses:
        if want_text.endswith(".*"):
            prefix = _release(want_text[:-2])
            hit = _padded(have, len(prefix))[: len(prefix)] == prefix
            if (op == "==") != hit:
                return False
            continue
        want = _release(want_text)
        n = max(len(have), len(want))
        a, b = _padded(have, n), _padded(want, n)
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b,
              "~=": a >= b and a[: max(len(want) - 1, 1)] == b[: max(len(want) - 1, 1)]}[op]
        if not ok:
            return False
    return True
