"""Job definitions (a playbook's `jobs:`), resolved per host, and the pure helpers `tail` uses to
read progress and failures out of a job's log."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..agent.core.protocol import CHECK_KINDS
from ..redaction import MASK, register
from .fields import reject_unknown
from .gpugate import DEFAULT_THRESHOLD_MIB, Gate
from .jobverdict import of as verdict_of
from .marks import did_you_mean
from .patterns import ENV_KEY, one_line
from .patterns import JOB_PATH as PATH
from .yamlsrc import ConfigError, Mapping

NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
EXTRACT_KEYS = {
    "backend",
    "model",
    "dataset",
    "output",
    "layer_ids",
    "tensor_parallel_size",
    "max_model_len",
    "batch_size",
    "limit",
}
COMMON_KEYS = {
    "kind",
    "description",
    "env",
    "cwd",
    "preflight",
    "gpu_gate",
    "progress",
    "failures",
    "overrides",
    "command",
    "secret_env",
}
GATE_KEYS = {"threshold", "gpus"}  # gpu_gate: as a mapping
DEFAULT_PREFLIGHT = ["requires", "grep", "compile"]
DEFAULT_PROGRESS = (
    r"samples=(?P<done>\d+)/(?P<total>\d+).*?tok/s=(?P<tok_s>[0-9.]+)(?:.*?eta=(?P<eta>[0-9.]+)s)?"
)
DEFAULT_FAILURES = [
    r"Traceback \(most recent call last\)",
    r"CUDA out of memory",
    r"Worker failed",
    r"^\w*(Error|Exception): ",
    r"\bKilled\b",
    r"fleetops: cannot start",
]


@dataclass
class JobSpec:
    name: str
    kind: str
    extract: dict[str, Any] | None
    argv: list[str] | None
    env: dict[str, str]
    secret_env: set[str]
    cwd: str | None
    preflight: list[str]
    gate: Gate | None
    progress: re.Pattern[str]
    failures: list[re.Pattern[str]]
    description: str = ""
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def start_request(self) -> dict[str, Any]:
        # an inventory's plain value for a key the playbook keeps
        _register_secrets(self.env, self.secret_env)
        shown = {k: (MASK if k in self.secret_env else v) for k, v in self.env.items()}
        return {
            "job": {
                "name": self.name,
                "kind": self.kind,
                "extract": self.extract,
                "argv": self.argv,
                "env": self.env,
                "shown_env": shown,
                "cwd": self.cwd,
            }
        }


def _err(m: Mapping, key: str, msg: str) -> ConfigError:
    return m.error(key, msg)


def _validate(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """Check one fully merged job definition; errors point at the job's line in the playbook."""
    kind = spec.get("kind", "extract")
    if kind not in ("extract", "command"):
        raise _err(where, "kind", f"job {name!r}: kind must be 'extract' or 'command'")
    if kind == "command":
        _validate_command(name, spec, where)
    else:
        _validate_extract(name, spec, where)
    cwd = spec.get("cwd")
    if cwd is not None and not (
        isinstance(cwd, str) and PATH.fullmatch(cwd) and not cwd.startswith("-")
    ):
        raise _err(
            where,
            "cwd",
            f"job {name!r}: 'cwd' must be a path (no spaces, quotes or '..', not starting "
            "with '-')",
        )
    _validate_env(name, spec, where)
    _validate_patterns(name, spec, where)
    _validate_gate(name, spec, where)
    _validate_preflight(name, spec, where)


def _validate_command(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """A command job's argv: words, no shell."""
    argv = spec.get("command")
    if not (
        isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)
    ):
        raise _err(
            where, "command", f"job {name!r}: 'command' must be a list of argv words (no shell)"
        )


def _validate_preflight(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """The check kinds run before the launch, each one that exists."""
    preflight = spec.get("preflight", DEFAULT_PREFLIGHT)
    if not isinstance(preflight, list) or not all(isinstance(k, str) for k in preflight):
        raise _err(
            where,
            "preflight",
            f"job {name!r}: preflight must be a list of check kinds ([] for none)",
        )
    for kind in preflight:
        if kind not in CHECK_KINDS:  # a misspelled kind would silently skip its checks
            raise _err(
                where,
                "preflight",
                f"job {name!r}: preflight names unknown check kind {kind!r}"
                f"{did_you_mean(kind, CHECK_KINDS)} (kinds: {', '.join(CHECK_KINDS)})",
            )


def _validate_gate(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """gpu_gate: false (no gate), true or a mapping of GATE_KEYS; a misspelled key is refused, never
    ignored."""
    gate = spec.get("gpu_gate")
    if gate is None or isinstance(gate, bool):
        return
    if not isinstance(gate, dict):
        raise _err(
            where,
            "gpu_gate",
            f"job {name!r}: gpu_gate must be false, true or a mapping of "
            f"{', '.join(sorted(GATE_KEYS))}",
        )
    if isinstance(gate, Mapping):
        reject_unknown(gate, GATE_KEYS, f"job {name!r} gpu_gate")
    threshold = gate.get("threshold", DEFAULT_THRESHOLD_MIB)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise _err(
            where, "gpu_gate", f"job {name!r}: gpu_gate threshold must be a whole number of MiB"
        )
    if _gpu_list(gate.get("gpus")) is None:
        raise _err(
            where,
            "gpu_gate",
            f'job {name!r}: gpu_gate gpus must be GPU indices: 3, "0,1,2" or [0, 1]',
        )


def _gpu_list(value: object) -> tuple[int, ...] | None:
    """gpu_gate's gpus as indices: () for every GPU (absent), None when it is not a list of
    indices."""
    if value is None or value == "":
        return ()
    words = (
        value
        if isinstance(value, list)
        else str(value).split(",")
        if not isinstance(value, bool)
        else [""]
    )
    try:
        out = tuple(int(str(w).strip()) for w in words)
    except ValueError:
        return None
    return (
        out
        if out and all(i >= 0 for i in out) and not any(isinstance(w, bool) for w in words)
        else None
    )


def _validate_extract(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """An extraction job's backend, paths, layers and sizes."""
    for key in ("backend", "model", "dataset", "output", "layer_ids"):
        if key not in spec:
            raise ConfigError(where.path, where.line, f"job {name!r} needs {key!r}", where.column)
    if spec["backend"] not in ("vllm", "transformers"):
        raise _err(where, "backend", f"job {name!r}: backend must be 'vllm' or 'transformers'")
    for key in ("model", "dataset", "output"):
        if not isinstance(spec[key], str) or not PATH.fullmatch(spec[key]):
            raise _err(
                where, key, f"job {name!r}: {key!r} must be a path (no spaces, quotes or '..')"
            )
    if not _whole_numbers(spec["layer_ids"], least=0):
        raise _err(where, "layer_ids", f"job {name!r}: layer_ids must be a list of layer numbers")
    for key in ("tensor_parallel_size", "max_model_len", "batch_size", "limit"):
        if key in spec and not _whole_numbers([spec[key]], least=1):
            raise _err(where, key, f"job {name!r}: {key!r} must be a positive integer")


def _whole_numbers(values: object, least: int) -> bool:
    """A non-empty list of whole numbers (not booleans), each `least` or more."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= least for i in values)
    )


def _validate_env(name: str, spec: dict[str, Any], where: Mapping) -> None:
    env = spec.get("env", {}) or {}
    if not isinstance(env, dict):
        raise _err(where, "env", f"job {name!r}: env must be a mapping")
    for k, v in env.items():
        if not (isinstance(k, str) and ENV_KEY.fullmatch(k)):
            raise _err(where, "env", f"job {name!r}: bad environment variable name {k!r}")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool) or not one_line(str(v)):
            raise _err(where, "env", f"job {name!r}: value of {k} must be one line of text")


def _validate_patterns(name: str, spec: dict[str, Any], where: Mapping) -> None:
    """The progress and failure regexes compile."""
    for key in ("progress",):
        if key in spec:
            try:
                re.compile(spec[key])
            except (re.error, TypeError) as exc:
                raise _err(where, key, f"job {name!r}: bad regex: {exc}") from None
    for pattern in spec.get("failures", []) or []:
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise _err(where, "failures", f"job {name!r}: bad regex {pattern!r}: {exc}") from None


def _register_secrets(env: dict[str, Any], keys: object) -> None:
    for key in keys if isinstance(keys, (list, tuple, set, frozenset)) else ():
        if key in env and isinstance(env[key], (str, int, float)):
            register(str(env[key]))


def parse_jobs(jobs: Mapping) -> dict[str, Mapping]:
    """Validate every job and every group override merged onto it, at playbook load time. The values
    its `secret_env` names are registered as secrets here, so every task that loads the playbook
    (status, logs, tail, diagnose, ... not only the launch) masks them in its output, its JSON and
    the audit log."""
    for name, spec in jobs.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise jobs.error(name, f"job name {name!r} must match {NAME.pattern}")
        if not isinstance(spec, Mapping):
            raise jobs.error(name, f"job {name!r} must be a mapping")
        reject_unknown(spec, COMMON_KEYS | EXTRACT_KEYS, f"job {name!r}")
        overrides = spec.get("overrides") or Mapping()
        if not isinstance(overrides, Mapping):
            raise spec.error("overrides", "overrides must map group names to job settings")
        base = _merged(spec, None)
        _validate(name, base, spec)
        _register_secrets(base.get("env") or {}, base.get("secret_env"))
        for group, over in overrides.items():
            if not isinstance(over, Mapping):
                raise overrides.error(group, f"override for group {group!r} must be a mapping")
            reject_unknown(
                over,
                (COMMON_KEYS | EXTRACT_KEYS) - {"overrides"},
                f"job {name!r} override {group!r}",
            )
            merged = _merged(spec, over)
            _validate(name, merged, over)
            _register_secrets(merged.get("env") or {}, merged.get("secret_env"))
    return dict(jobs)


def _merged(spec: Mapping, over: Mapping | None) -> dict[str, Any]:
    out = {k: v for k, v in spec.items() if k != "overrides"}
    if over:
        out.update(over)
    return out


def resolve(name: str, spec: Mapping, groups: tuple[str, ...]) -> JobSpec:
    """The job as this host runs it: the base definition plus the overrides of the host's groups."""
    overrides = spec.get("overrides", {}) or {}
    merged = _merged(spec, None)
    notes = []
    for group in groups:
        if group in overrides:
            merged.update(overrides[group])
            notes.append(f"settings for group {group!r} applied")
    kind = merged.get("kind", "extract")
    extract = None
    if kind == "extract":
        extract = {
            "backend": merged["backend"],
            "model": merged["model"],
            "dataset": merged["dataset"],
            "output": merged["output"],
            "layer_ids": list(merged["layer_ids"]),
            "tensor_parallel_size": merged.get("tensor_parallel_size", 1),
            "max_model_len": merged.get("max_model_len", 2048),
            "batch_size": merged.get("batch_size", 8),
            "limit": merged.get("limit"),
        }
    gate_spec = merged.get("gpu_gate", {})
    gate = None
    if gate_spec is not False:
        gate_spec = gate_spec if isinstance(gate_spec, dict) else {}  # true: the defaults
        gate = Gate(
            int(gate_spec.get("threshold", DEFAULT_THRESHOLD_MIB)),
            _gpu_list(gate_spec.get("gpus")) or None,
        )
    return JobSpec(
        name=name,
        kind=kind,
        extract=extract,
        argv=list(merged["command"]) if kind == "command" else None,
        env={k: str(v) for k, v in (merged.get("env") or {}).items()},
        secret_env=set(merged.get("secret_env") or []),
        cwd=merged.get("cwd"),
        preflight=list(merged.get("preflight", DEFAULT_PREFLIGHT)),
        gate=gate,
        progress=re.compile(merged.get("progress", DEFAULT_PROGRESS)),
        failures=[re.compile(p) for p in merged.get("failures", DEFAULT_FAILURES)],
        description=str(merged.get("description", "")),
        source=f"{spec.path}:{spec.line}",
        notes=notes,
    )


def parse_progress(line: str, rx: re.Pattern[str]) -> dict[str, Any] | None:
    m = rx.search(line)
    if not m:
        return None
    groups = m.groupdict()
    out: dict[str, float] = {}
    for key in ("done", "total", "tok_s", "eta"):
        if groups.get(key) is not None:
            out[key] = float(groups[key])
    return out


def is_failure(line: str, patterns: list[re.Pattern[str]]) -> bool:
    return any(p.search(line) for p in patterns)


@dataclass
class LogWatch:
    """A job's log lines as tail and logs read them: the job's progress and failure patterns (the
    defaults when the playbook names no such job) and the failure lines seen so far."""

    progress: re.Pattern[str]
    failure: list[re.Pattern[str]]
    failures: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, spec: JobSpec | None) -> LogWatch:
        if spec is not None:
            return cls(spec.progress, spec.failures)
        return cls(re.compile(DEFAULT_PROGRESS), [re.compile(p) for p in DEFAULT_FAILURES])

    def read(self, line: str) -> tuple[bool, dict[str, Any] | None]:
        """(a failure line?, its progress): a failure line is kept in `failures`."""
        failed = is_failure(line, self.failure)
        if failed:
            self.failures.append(line)
        return failed, parse_progress(line, self.progress)


def exit_code_of(state: dict[str, Any]) -> int:
    """What `status` and `tail` exit with for a job, SSH or Slurm alike (the README's table, through
    the one verdict every reader shares: plans/jobverdict.py): 0 while it runs, when it succeeded or
    when fleetops' own `stop` ended it, 1 for any other end. The job's own exit status (its code, or
    the signal) is in the message and in --json, not in the process's status."""
    return verdict_of(state).code


def describe_end(state: dict[str, Any]) -> str:
    ended = state.get("exit") or {}
    word = verdict_of(state).word
    if word == "succeeded":
        return "succeeded (exit status 0)"
    if word == "stopped":
        how = (
            f"signal {ended['signal']}"
            if ended.get("signal")
            else f"exit status {ended.get('exit_code')}"
        )
        return f"stopped by fleetops' `stop` ({how})"
    if ended.get("signal"):
        return f"killed by signal {ended['signal']}"
    if state.get("state") == "lost":
        return (
            "lost: its wrapper is gone and left no exit "
            "status (node rebooted, or the group was SIGKILLed)"
        )
    return f"failed (exit status {ended.get('exit_code')})"
