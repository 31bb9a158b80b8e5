"""The client/node wire contract, in one place (stdlib only): both fleetops (client) and the node agent
import it. Change the contract here and bump PROTOCOL; a mismatched pair refuses to talk."""

from __future__ import annotations

# A request carries it; the agent refuses any other (see agent.main).
PROTOCOL = 1

# Every op the agent answers. ping is built in; the others name (module, function) in agent.OPS.
OPS = ("ping", "patch", "rollback", "verify", "gpu", "facts", "preflight", "job_start", "job_status", "job_tail",
       "job_logs", "job_stop", "run", "jobs_list", "fetch_plan", "diagnose", "capture", "slurm", "shards", "drain",
       "undrain")

# Ops that change nothing on the node (they read files, /proc, nvidia-smi, a job's logs): the one list of
# them. The client may send one before the previous request's answer is in (pipelining): if that
# earlier step fails, the read-only one has run for nothing and its answer is dropped; nothing else happened.
# Never add an op that writes (patch, rollback, job_start, job_stop, run, capture, fetch_plan, ...).
READ_ONLY_OPS = frozenset({"ping", "verify", "gpu", "facts", "job_status", "job_logs", "job_tail", "jobs_list",
                           "diagnose"})
assert set(OPS) >= READ_ONLY_OPS

# The kinds of check a playbook's verify: may name ("requires" is added from the playbook's requires:).
CHECK_KINDS = ("requires", "grep", "compile", "import", "callsites", "probe")

# Status words of patch/rollback items (remote_scripts/patch/patching.py writes them, fleetops/tasks/patching.py
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
# Parsed with string methods, not `re`: the agent parses them at every patch and verify, and importing `re`
# (with the enum, functools and collections it pulls in) was ~7 ms of each agent start.
# The grammar is exactly that of the regular expressions they replace (tests/test_agent_lean_units.py checks
# both on the same inputs): \s is str.isspace(), \d is str.isdecimal(), `.` is anything but a newline.
#   requirement: \s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)
#   clause:      \s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)\s*
#   release:     (\d+(?:\.\d+)*) at the start of the version, before any "+local" part
# ASCII letters and digits (the `string` module imports re, so its constants cannot be used on the node)
ASCII_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_NAME_CHARS = ASCII_ALNUM | frozenset("._-")
_VERSION_CHARS = ASCII_ALNUM | frozenset(".*+!-")
_VERSION_OPS = ("~=", "==", "!=", "<=", ">=", "<", ">")  # two-character ones first: "<=" is not "<" then "="


def _after_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _after(text: str, i: int, chars: frozenset) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _clause(part: str) -> tuple[str, str] | None:
    i = _after_space(part, 0)
    op = next((o for o in _VERSION_OPS if part.startswith(o, i)), None)
    if op is None:
        return None
    start = _after_space(part, i + len(op))
    if start >= len(part) or part[start] not in "0123456789":
        return None
    end = _after(part, start + 1, _VERSION_CHARS)
    return (op, part[start:end]) if _after_space(part, end) == len(part) else None


def parse_requirement(text: str) -> tuple[str, list[tuple[str, str]]]:
    start = _after_space(text, 0)
    end = _after(text, start, _NAME_CHARS)
    rest_at = _after_space(text, end)
    if end == start or text[start] not in ASCII_ALNUM or "\n" in text[rest_at:]:
        raise ValueError(f"not a requirement: {text!r}")
    name, rest = text[start:end], text[rest_at:].strip()
    clauses = []
    if rest:
        for part in rest.split(","):
            clause = _clause(part)
            if clause is None:
                raise ValueError(f"bad version clause {part.strip()!r} in {text!r}")
            op, ver = clause
            if "*" in ver and (op not in ("==", "!=") or not ver.endswith(".*") or "*" in ver[:-2]):
                raise ValueError(f"wildcard only allowed as '==X.*' or '!=X.*' in {text!r}")
            clauses.append((op, ver))
    return name, clauses


def _release(version: str) -> tuple[int, ...]:
    text, parts, i = version.split("+", 1)[0], [], 0
    while True:
        end = i
        while end < len(text) and text[end].isdecimal():
            end += 1
        if end == i:
            return tuple(parts)
        parts.append(int(text[i:end]))
        if not (end + 1 < len(text) and text[end] == "." and text[end + 1].isdecimal()):
            return tuple(parts)
        i = end + 1


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
