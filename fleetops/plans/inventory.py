"""The YAML inventory (hosts/*.yaml): names → how to reach a node and where its venv lives.

Every value that later reaches a remote command line is checked against a strict pattern here, so a
`;`, `$(...)` or newline in the inventory is refused with file:line before anything connects.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .patterns import ENV_KEY, REMOTE_PATH, one_line
from .yamlsrc import (
    ConfigError,
    Mapping,
    expect_mapping,
    get_bool,
    get_int,
    get_str,
    get_str_list,
    load_file,
    reject_unknown,
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:]{2,39}")
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
GROUP = NAME
JUMP = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::[0-9]{1,5})?")

HOST_KEYS = {"address", "port", "user", "identity_file", "identity_passphrase", "known_hosts", "jump", "python",
             "state_dir", "groups", "gpus", "lab", "connect_timeout", "env"}
TOP_KEYS = {"hosts", "defaults", "example"}
DEFAULT_STATE_DIR = ".fleetops"  # relative: the node's exec starts in the login user's home


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    jump: str | None = None
    python: str = "python3"
    state_dir: str = DEFAULT_STATE_DIR
    groups: tuple[str, ...] = ()
    gpus: int | None = None
    lab: bool = False
    example: bool = False
    plain: bool = False  # a -H word not in the inventory: ssh_config decides user, port and key
    connect_timeout: int = 10
    identity_passphrase: str | None = field(default=None, repr=False)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # added to job environments
    secret_env: frozenset[str] = frozenset()
    source: str = ""  # file:line that defined it, for messages

    @property
    def label(self) -> str:
        return self.name


@dataclass
class Inventory:
    hosts: dict[str, Host] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.hosts)

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for host in self.hosts.values():
            for group in host.groups:
                out.setdefault(group, []).append(host.name)
        return out

    def resolve(self, spec: str) -> Host:
        """One -H word → a Host. Inventory names win; addresses and ssh_config aliases fall through."""
        if spec in self.hosts:
            return self.hosts[spec]
        if is_plain_ssh_target(spec):
            return plain_host(spec)
        known = ", ".join(self.names()) or "(none: run `fab lab.up` or add hosts/*.yaml)"
        raise UnknownHost(f"unknown host {spec!r}; known hosts: {known}")

    def expand(self, words: list[str]) -> list[Host]:
        """-H values → hosts, with @group expanding to its members in inventory order."""
        out: list[Host] = []
        groups = self.groups()
        for word in words:
            word = word.strip()
            if not word:
                continue
            if word.startswith("@"):
                members = groups.get(word[1:])
                if not members:
                    raise UnknownHost(f"unknown group {word!r}; known groups: {', '.join(sorted(groups)) or '(none)'}")
                out.extend(self.hosts[m] for m in members)
            else:
                out.append(self.resolve(word))
        seen: set[str] = set()
        return [h for h in out if not (h.name in seen or seen.add(h.name))]


class UnknownHost(Exception):
    pass


def is_plain_ssh_target(spec: str) -> bool:
    """A -H word that is clearly meant for ssh itself: user@host, host:port, a dotted name or an IP,
    or an alias that ~/.ssh/config defines explicitly."""
    if "@" in spec or ":" in spec or "." in spec:
        return True
    return spec in ssh_config_aliases()


def ssh_config_aliases(path: Path | None = None) -> set[str]:
    path = path or Path.home() / ".ssh" / "config"
    aliases: set[str] = set()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return aliases
    for line in text.splitlines():
        words = line.strip().split()
        if len(words) >= 2 and words[0].lower() == "host":
            aliases.update(w for w in words[1:] if not any(c in w for c in "*?!"))
    return aliases


def plain_host(spec: str) -> Host:
    user, _, rest = spec.rpartition("@")
    address, _, port = rest.partition(":")
    if not (ADDRESS.fullmatch(address) and (not user or USER.fullmatch(user)) and (not port or port.isdigit())):
        raise UnknownHost(f"not a valid host {spec!r}")
    return Host(name=spec, address=address, port=int(port) if port else 22, user=user or None,
                plain=True, source="command line (ssh_config)")


def load_inventory(directory: Path) -> Inventory:
    inv = Inventory()
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        _load_one(path, inv)
    return inv


def _load_one(path: Path, inv: Inventory) -> None:
    doc = load_file(path)
    if doc is None:
        return
    doc = expect_mapping(doc, str(path), 1, "an inventory file")
    reject_unknown(doc, TOP_KEYS, "inventory file")
    example = get_bool(doc, "example")
    defaults = expect_mapping(doc.get("defaults", Mapping()), str(path), doc.line_of("defaults"), "'defaults'")
    if "hosts" not in doc:
        raise ConfigError(path, doc.line, "missing required key 'hosts'")
    hosts = expect_mapping(doc["hosts"], str(path), doc.line_of("hosts"), "'hosts'")
    inv.files.append(str(path))
    for name, spec in hosts.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise hosts.error(name, f"host name {name!r} must match {NAME.pattern}")
        if name in inv.hosts:
            raise hosts.error(name, f"host {name!r} already defined at {inv.hosts[name].source}")
        spec = expect_mapping(spec, str(path), hosts.line_of(name), f"host {name!r}")
        merged = Mapping({**defaults, **spec})
        merged.path, merged.line = str(path), spec.line
        merged.key_lines = {**getattr(defaults, "key_lines", {}), **spec.key_lines}
        inv.hosts[name] = _parse_host(name, merged, path, example)


def _local_path(value: str | None, base: Path) -> str | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _secret_or_plain(m: Mapping, key: str, value: object, what: str) -> tuple[str, bool]:
    """A value, or {secret: value} / {secret_from_env: NAME} for one that must never be shown."""
    from ..redaction import register

    if isinstance(value, dict):
        if set(value) == {"secret"} and isinstance(value["secret"], (str, int)):
            return register(str(value["secret"])), True
        if set(value) == {"secret_from_env"} and isinstance(value["secret_from_env"], str):
            var = value["secret_from_env"]
            if var not in os.environ:
                raise m.error(key, f"{what}: environment variable {var} (secret_from_env) is not set")
            return register(os.environ[var]), True
        raise m.error(key, f"{what}: use a plain value, {{secret: ...}} or {{secret_from_env: NAME}}")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise m.error(key, f"{what} must be text")
    return str(value), False


def _parse_env(m: Mapping) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    raw = m.get("env") or {}
    if not isinstance(raw, dict):
        raise m.error("env", "'env' must map variable names to values")
    env, secret = [], set()
    for key, value in raw.items():
        if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
            raise m.error("env", f"bad environment variable name {key!r}")
        text, is_secret = _secret_or_plain(m, "env", value, f"env {key}")
        if not one_line(text):
            raise m.error("env", f"env {key}: value must be one line")
        env.append((key, text))
        if is_secret:
            secret.add(key)
    return tuple(env), frozenset(secret)


def _parse_host(name: str, m: Mapping, path: Path, example: bool) -> Host:
    reject_unknown(m, HOST_KEYS, f"host {name!r}")
    address = get_str(m, "address", required=True, pattern=ADDRESS, describe="a host name or IP address")
    python = get_str(m, "python", default="python3", pattern=REMOTE_PATH,
                     describe="an absolute path to the venv's python, no spaces, quotes or '..'")
    if python != "python3" and not python.startswith("/"):
        raise m.error("python", f"'python' must be an absolute path, got {python!r}")
    state_dir = get_str(m, "state_dir", default=DEFAULT_STATE_DIR, pattern=REMOTE_PATH,
                        describe="a path with no spaces, quotes or '..'")
    groups = get_str_list(m, "groups", pattern=GROUP, describe="group names are plain words")
    base = path.parent
    env, secret_env = _parse_env(m)
    passphrase = None
    if "identity_passphrase" in m:
        passphrase, _ = _secret_or_plain(m, "identity_passphrase", m["identity_passphrase"], "identity_passphrase")
        from ..redaction import register

        register(passphrase)  # a passphrase is secret even when written as a plain value
    return Host(
        name=name,
        address=address,
        port=get_int(m, "port", default=22, minimum=1, maximum=65535),
        user=get_str(m, "user", pattern=USER, describe="a plain user name"),
        identity_file=_local_path(get_str(m, "identity_file"), base),
        known_hosts=_local_path(get_str(m, "known_hosts"), base),
        jump=get_str(m, "jump", pattern=JUMP, describe="an inventory name or user@host:port"),
        python=python,
        state_dir=state_dir.rstrip("/") or "/",
        groups=tuple(groups),
        gpus=get_int(m, "gpus", minimum=0, maximum=1024),
        lab=get_bool(m, "lab"),
        example=example,
        connect_timeout=get_int(m, "connect_timeout", default=10, minimum=1, maximum=600),
        identity_passphrase=passphrase,
        env=env,
        secret_env=secret_env,
        source=f"{path}:{m.line}",
    )
