"""One inventory file (hosts/*.yaml) read into Hosts: its keys checked, `defaults` merged into each
host, paths, secrets ({secret: ...}, {secret_from_env: NAME}), the job environment and `jump:` read,
every error at file:line.

Every value that later reaches a remote command line is checked against a strict pattern here
(plans/host.py), so a `;`, `$(...)` or newline in the inventory is refused with file:line before
anything connects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .fields import expect_mapping, get_bool, get_int, get_str, get_str_list, reject_unknown
from .host import (
    ADDRESS,
    BECOME,
    BECOME_STATE_DIR,
    DEFAULT_STATE_DIR,
    GROUP,
    JUMP,
    MAX_MASTERS_CAP,
    MAX_PERSIST,
    NAME,
    SCHEDULER,
    TRANSPORT,
    USER,
    Host,
    join_target,
)
from .patterns import ENV_KEY, REMOTE_PATH, one_line
from .slurm import ACCOUNT, GRES, PARTITION, TIME_LIMIT
from .yamlsrc import ConfigError, Mapping, load_file

HOST_KEYS = {
    "address",
    "port",
    "user",
    "identity_file",
    "identity_passphrase",
    "known_hosts",
    "jump",
    "python",
    "state_dir",
    "groups",
    "gpus",
    "lab",
    "connect_timeout",
    "env",
    # these five: a Slurm login node
    "scheduler",
    "partition",
    "account",
    "gres",
    "time_limit",
    "slurm_node",  # the host's own name as a Slurm node: drain/undrain tell Slurm too
    "become",  # "sudo": the agent runs as root through `sudo -n` (docs/become.md)
    # how the host is reached: the system `ssh` or paramiko, and its masters
    "transport",
    "persist",
    # under defaults only: how many masters persist (one cap for the control directory)
    "max_masters",
}
TOP_KEYS = {"hosts", "defaults", "example"}
# `jump:` as a host of its own
JUMP_KEYS = {"address", "port", "user", "identity_file", "known_hosts"}


def load_one(path: Path, known: dict[str, Host], files: list[str]) -> None:
    """One inventory file's hosts into `known` (a name defined twice, here or in an earlier file, is
    an error) and the file into `files`; an empty file adds nothing."""
    doc = load_file(path)
    if doc is None:
        return
    doc = expect_mapping(doc, str(path), 1, "an inventory file")
    reject_unknown(doc, TOP_KEYS, "inventory file")
    example = get_bool(doc, "example")
    defaults = expect_mapping(
        doc.get("defaults", Mapping()), str(path), doc.line_of("defaults"), "'defaults'"
    )
    if "hosts" not in doc:
        raise ConfigError(path, doc.line, "missing required key 'hosts'", doc.column)
    hosts = expect_mapping(doc["hosts"], str(path), doc.line_of("hosts"), "'hosts'")
    files.append(str(path))
    for name, spec in hosts.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise hosts.error(name, f"host name {name!r} must match {NAME.pattern}")
        if name in known:
            raise hosts.error(name, f"host {name!r} already defined at {known[name].source}")
        spec = expect_mapping(spec, str(path), hosts.line_of(name), f"host {name!r}")
        if "max_masters" in spec:
            raise spec.error(
                "max_masters",
                "'max_masters' caps the masters of every host at once: put it under defaults",
            )
        merged = Mapping({**defaults, **spec})
        merged.path, merged.line = str(path), spec.line
        merged.key_lines = {**getattr(defaults, "key_lines", {}), **spec.key_lines}
        merged.key_cols = {**getattr(defaults, "key_cols", {}), **getattr(spec, "key_cols", {})}
        merged.column = spec.column
        known[name] = _parse_host(name, merged, path, example)


def _absolute(m: Mapping, key: str, value: str | None, *, home: bool = False) -> str | None:
    """A path field: absolute (`~/` too where `home`), never starting with '-' (it would become an
    option on a command line: `state_dir: "-c"` made the agent command `python -c/bin/...`)."""
    if value is None:
        return None
    expanded = os.path.expanduser(value) if home and value.startswith("~/") else value
    if value.startswith("-") or not expanded.startswith("/"):
        also = " or ~/..." if home else ""
        raise m.error(
            key, f"{key!r} must be an absolute path (starting with /{also}), got {value!r}"
        )
    return expanded


def _local_path(m: Mapping, key: str) -> str | None:
    value = _absolute(m, key, get_str(m, key), home=True)
    if value is not None and ("\0" in value or not one_line(value)):
        raise m.error(key, f"{key!r} must be one line")
    return value


def _secret_or_plain(m: Mapping, key: str, value: object, what: str) -> tuple[str | None, bool]:
    """A value, or {secret: value} / {secret_from_env: NAME} for one that must never be shown.
    (None, True): a secret_from_env whose variable is not set, recorded in `missing` by the
    caller."""
    from ..redaction import register

    if isinstance(value, dict):
        if set(value) == {"secret"} and isinstance(value["secret"], (str, int)):
            return register(str(value["secret"])), True
        if set(value) == {"secret_from_env"} and isinstance(value["secret_from_env"], str):
            var = value["secret_from_env"]
            if var not in os.environ:
                return None, True
            return register(os.environ[var]), True
        raise m.error(
            key, f"{what}: use a plain value, {{secret: ...}} or {{secret_from_env: NAME}}"
        )
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise m.error(key, f"{what} must be text")
    return str(value), False


def _unset(where: Mapping, key: str, what: str, value: dict[str, Any]) -> str:
    err = where.error(
        key,
        f"{what}: environment variable {value['secret_from_env']} (secret_from_env) is not set "
        "in this shell; set it and run again (only tasks that need it fail)",
    )
    return str(err)


def _parse_env(
    m: Mapping, missing: list[tuple[str, str]]
) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    raw = m.get("env") or {}
    if not isinstance(raw, dict):
        raise m.error("env", "'env' must map variable names to values")
    env, secret = [], set()
    for key, value in raw.items():
        if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
            raise m.error("env", f"bad environment variable name {key!r}")
        text, is_secret = _secret_or_plain(m, "env", value, f"env {key}")
        if text is None:
            where = raw if isinstance(raw, Mapping) and isinstance(value, dict) else m
            missing.append(
                ("env", _unset(where, key if where is raw else "env", f"env {key}", value))
            )
            secret.add(key)
            continue
        if not one_line(text):
            raise m.error("env", f"env {key}: value must be one line")
        env.append((key, text))
        if is_secret:
            secret.add(key)
    return tuple(env), frozenset(secret)


def _jump_word(m: Mapping) -> str | None:
    jump = _jump_host(m)
    if jump is not None:
        return jump.name
    return get_str(
        m,
        "jump",
        pattern=JUMP,
        describe="an inventory name, user@host:port, or a mapping of "
        f"{', '.join(sorted(JUMP_KEYS))}",
    )


def _jump_host(m: Mapping) -> Host | None:
    """`jump:` as a mapping: the jump host's own address, port, user, identity_file and
    known_hosts."""
    if not isinstance(m.get("jump"), dict):
        return None
    spec = expect_mapping(m["jump"], m.path, m.line_of("jump"), "'jump'")
    reject_unknown(spec, JUMP_KEYS, "'jump'")
    user = get_str(spec, "user", pattern=USER, describe="a plain user name")
    address = (
        get_str(
            spec, "address", required=True, pattern=ADDRESS, describe="a host name or IP address"
        )
        or ""
    )
    port = get_int(spec, "port", default=22, minimum=1, maximum=65535) or 22
    return Host(
        name=join_target(user, address, port if "port" in spec else None),
        address=address,
        port=port,
        user=user,
        identity_file=_local_path(spec, "identity_file"),
        known_hosts=_local_path(spec, "known_hosts"),
        source=f"{spec.path}:{spec.line}",
    )


def _parse_host(name: str, m: Mapping, path: Path, example: bool) -> Host:
    reject_unknown(m, HOST_KEYS, f"host {name!r}")
    for key in ("partition", "account", "gres", "time_limit"):
        if key in m and m.get("scheduler") != "slurm":
            raise m.error(
                key,
                f"host {name!r}: {key!r} is a Slurm setting; add 'scheduler: slurm' (a login node)",
            )
    address = get_str(
        m, "address", required=True, pattern=ADDRESS, describe="a host name or IP address"
    )
    python = get_str(
        m,
        "python",
        default="python3",
        pattern=REMOTE_PATH,
        describe="an absolute path to the venv's python, no spaces, quotes or '..'",
    )
    if python != "python3":
        _absolute(m, "python", python)
    state_dir = get_str(
        m, "state_dir", pattern=REMOTE_PATH, describe="a path with no spaces, quotes or '..'"
    )
    become = get_str(
        m,
        "become",
        pattern=BECOME,
        describe="'sudo' (or leave it out: the login user runs the agent)",
    )
    # the default: in the login's home, or root's own with become
    state_dir = _absolute(m, "state_dir", state_dir) or (
        BECOME_STATE_DIR if become else DEFAULT_STATE_DIR
    )
    groups = get_str_list(m, "groups", pattern=GROUP, describe="group names are plain words")
    missing: list[tuple[str, str]] = []
    env, secret_env = _parse_env(m, missing)
    passphrase = None
    if "identity_passphrase" in m:
        passphrase, _ = _secret_or_plain(
            m, "identity_passphrase", m["identity_passphrase"], "identity_passphrase"
        )
        if passphrase is None:
            missing.append(
                (
                    "identity_passphrase",
                    _unset(
                        m, "identity_passphrase", "identity_passphrase", m["identity_passphrase"]
                    ),
                )
            )
        from ..redaction import register

        register(passphrase or "")  # a passphrase is secret even when written as a plain value
    return Host(
        name=name,
        address=address,
        port=get_int(m, "port", default=22, minimum=1, maximum=65535),
        user=get_str(m, "user", pattern=USER, describe="a plain user name"),
        identity_file=_local_path(m, "identity_file"),
        known_hosts=_local_path(m, "known_hosts"),
        jump=_jump_word(m),
        jump_host=_jump_host(m),
        python=python,
        state_dir=state_dir.rstrip("/") or "/",
        groups=tuple(groups),
        gpus=get_int(m, "gpus", minimum=0, maximum=1024),
        lab=get_bool(m, "lab"),
        example=example,
        connect_timeout=get_int(m, "connect_timeout", default=10, minimum=1, maximum=600),
        passphrase=passphrase,
        env_values=env,
        secret_env=secret_env,
        source=f"{path}:{m.line}",
        missing_secrets=tuple(missing),
        scheduler=get_str(
            m, "scheduler", pattern=SCHEDULER, describe="'slurm' (or leave it out for plain SSH)"
        ),
        partition=get_str(m, "partition", pattern=PARTITION, describe="a Slurm partition name"),
        account=get_str(m, "account", pattern=ACCOUNT, describe="a Slurm account name"),
        gres=get_str(m, "gres", pattern=GRES, describe="a Slurm gres such as gpu:8 or gpu:h200:8"),
        time_limit=get_str(
            m,
            "time_limit",
            pattern=TIME_LIMIT,
            describe="a Slurm time limit: minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED",
        ),
        slurm_node=get_str(
            m, "slurm_node", pattern=NAME, describe="the host's node name in Slurm (one name)"
        ),
        become=become,
        transport=get_str(
            m, "transport", pattern=TRANSPORT, describe="'openssh' (the system ssh) or 'paramiko'"
        ),
        persist=get_int(m, "persist", minimum=0, maximum=MAX_PERSIST),
        max_masters=get_int(m, "max_masters", minimum=1, maximum=MAX_MASTERS_CAP),
    )
