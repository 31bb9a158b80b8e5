"""The YAML inventory (hosts/*.yaml): names → how to reach a node and where its venv lives.

Every value that later reaches a remote command line is checked against a strict pattern here, so a
`;`, `$(...)` or newline in the inventory is refused with file:line before anything connects.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping as Mapping_
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import hostrange, sshconfig
from .fields import expect_mapping, get_bool, get_int, get_str, get_str_list, reject_unknown
from .hostrange import split_words
from .marks import did_you_mean
from .patterns import ENV_KEY, REMOTE_PATH, one_line
from .slurm import ACCOUNT, GRES, PARTITION, TIME_LIMIT
from .yamlsrc import ConfigError, Mapping, load_file

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:]{2,39}")
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
GROUP = NAME
SCHEDULER = re.compile(r"slurm")
JUMP = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::[0-9]{1,5})?")

HOST_KEYS = {"address", "port", "user", "identity_file", "identity_passphrase", "known_hosts", "jump", "python",
             "state_dir", "groups", "gpus", "lab", "connect_timeout", "env",
             "scheduler", "partition", "account", "gres", "time_limit",  # these five: a Slurm login node
             "slurm_node",  # the host's own name as a Slurm node: drain/undrain tell Slurm too
             "become"}  # "sudo": the agent runs as root through `sudo -n` (docs/become.md)
TOP_KEYS = {"hosts", "defaults", "example"}
DEFAULT_STATE_DIR = ".fleetops"  # relative: the node's exec starts in the login user's home
# With become, root runs the agent: its state dir must be root's (the bootstrap refuses one the login user owns,
# who could swap what root runs), so the default moves out of the login user's home.
BECOME_STATE_DIR = "/var/lib/fleetops"
BECOME = re.compile(r"sudo")


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
    passphrase: str | None = field(default=None, repr=False)  # read it as identity_passphrase
    env_values: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # read it as env
    secret_env: frozenset[str] = frozenset()
    source: str = ""  # file:line that defined it, for messages
    # Secrets this host names but could not get ({secret_from_env: VAR} with VAR unset): (what, message).
    # Only this host's tasks that need them fail; reading env / identity_passphrase raises MissingSecret.
    missing_secrets: tuple[tuple[str, str], ...] = ()
    # scheduler "slurm": a login node; jobs go through sbatch (partition/account/gres/time_limit as given)
    scheduler: str | None = None
    partition: str | None = None
    account: str | None = None
    gres: str | None = None
    time_limit: str | None = None
    slurm_node: str | None = None  # the host is this node of a Slurm cluster (drain/undrain: scontrol update)
    become: str | None = None  # "sudo": the agent runs as root through sudo (wire/become.py)

    @property
    def label(self) -> str:
        return self.name

    def secret_problems(self, need_env: bool = True) -> list[str]:
        """Why this host cannot run a task: its key's passphrase (every task) or, when `need_env` (a task that
        starts a job), a job environment secret could not be read. [] when nothing is missing."""
        return [msg for what, msg in self.missing_secrets if need_env or what != "env"]

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """Added to job environments. Raises MissingSecret when a secret among them could not be read, so a
        job never starts without its token (and no other host or task is affected)."""
        problems = [msg for what, msg in self.missing_secrets if what == "env"]
        if problems:
            raise MissingSecret(f"{self.name}: " + "; ".join(problems))
        return self.env_values

    @property
    def identity_passphrase(self) -> str | None:
        problems = [msg for what, msg in self.missing_secrets if what == "identity_passphrase"]
        if problems:
            raise MissingSecret(f"{self.name}: " + "; ".join(problems))
        return self.passphrase


class MissingSecret(Exception):
    """A host's secret (secret_from_env) is not set in this process: that host's tasks that need it fail."""


@dataclass(frozen=True)
class CommandLine:
    """What the command line says for every host of the run: -u/--user, --port, -i (one key) and
    -t/--connect-timeout. The command line wins over the inventory and ssh_config, as ssh's own -l, -p, -i and
    -o ConnectTimeout do; a user or port written in the -H word itself (`root@lab01:2222`) wins over both. For a
    host outside the inventory the user and port join its -H word (ssh_config decides the rest) and -i is offered
    by the connection (wire/fabconfig.py); a jump host keeps its own settings."""

    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    connect_timeout: int | None = None

    def apply(self, host: Host, word: str) -> Host:
        if self == CommandLine():
            return host
        word_user, _, word_port = split_target(word) if word else (None, "", None)
        timeout = self.connect_timeout or host.connect_timeout
        if host.plain:
            user, name, port = split_target(host.name)
            spec = _target(user or self.user, name, port or self.port)
            return replace(plain_host(spec) if spec != host.name else host, connect_timeout=timeout)
        changed = replace(host, user=word_user or self.user or host.user, port=word_port or self.port or host.port,
                          connect_timeout=timeout)
        if self.identity_files:
            if len(self.identity_files) > 1:
                raise UnknownHost(f"-i names {len(self.identity_files)} keys; {host.name} is an inventory host, "
                                  "which logs in with one key: give one -i (a host outside the inventory tries each)")
            # The inventory's passphrase was for its own key, not this one.
            changed = replace(changed, identity_file=os.path.expanduser(self.identity_files[0]), passphrase=None,
                              missing_secrets=tuple(m for m in host.missing_secrets if m[0] != "identity_passphrase"))
        return changed


def _target(user: str | None, name: str, port: int | None) -> str:
    """(user, name, port) → `user@name:port`, an IPv6 address in brackets when a port follows it."""
    where = f"[{name}]:{port}" if port and ":" in name else f"{name}:{port}" if port else name
    return f"{user}@{where}" if user else where


@dataclass
class Inventory:
    hosts: dict[str, Host] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    # Names ssh_config defines (Host and Match host names without wildcards; Include and -S files too).
    # Computed in wire/ssh.py with paramiko's SSHConfig and handed in by the caller; None: read here from
    # the default files (plans/sshconfig.py), on first need.
    ssh_aliases: frozenset[str] | None = None
    # --allow-insecure-venv: a node whose interpreter others may write to runs the agent anyway, with a warning
    allow_insecure_venv: bool = False
    # --ask-become-pass: what was typed, sent only to sudo's prompt on the node (wire/become.py)
    become_password: str | None = field(default=None, repr=False)
    # -u, --port, -i, -t: applied to every host expand() selects (never to a jump host, as with ssh)
    command_line: CommandLine = field(default_factory=CommandLine)

    def names(self) -> list[str]:
        return sorted(self.hosts)

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for host in self.hosts.values():
            for group in host.groups:
                out.setdefault(group, []).append(host.name)
        return out

    def aliases(self) -> frozenset[str]:
        if self.ssh_aliases is None:
            self.ssh_aliases = frozenset(ssh_config_aliases())
        return self.ssh_aliases

    def resolve(self, spec: str) -> Host:
        """One -H word → a Host. Inventory names win (with `user@`/`:port` overriding theirs); addresses and
        ssh_config aliases fall through to ssh."""
        spec = spec.strip()
        if spec in self.hosts:
            return self.hosts[spec]
        user, name, port = split_target(spec)
        if name in self.hosts and (user or port):
            host = self.hosts[name]
            return replace(host, user=user or host.user, port=port or host.port)
        if user or port or "." in name or ":" in name or name in self.aliases():
            return plain_host(spec)
        raise UnknownHost(self._unknown(spec))

    def _unknown(self, spec: str) -> str:
        hint = did_you_mean(spec, [*self.hosts, *(f"@{g}" for g in self.groups())])
        known = ", ".join(self.names()) or "(none: run `fab lab.up` or add hosts/*.yaml)"
        # "did you mean" last: older messages (and scripts) read "unknown host 'x'; known hosts: ..."
        return f"unknown host {spec!r}; known hosts: {known} (looked in: {self._where()}){hint}"

    def _where(self) -> str:
        files = ", ".join(self.files) or "no inventory file"
        return f"{files}; and ssh_config's Host names"

    def _group(self, word: str) -> list[Host]:
        groups = self.groups()
        members = groups.get(word[1:])
        if not members:
            if any(c in word for c in "*?["):  # @gpu* : every group that matches
                members = [m for g in sorted(groups) if fnmatch.fnmatchcase(g, word[1:]) for m in groups[g]]
            if not members:
                hint = did_you_mean(word, [f"@{g}" for g in groups])
                known = ", ".join(sorted(groups)) or "(none)"
                raise UnknownHost(f"unknown group {word!r}{hint} (known groups: {known})")
        return [self.hosts[m] for m in members]

    def _glob(self, word: str) -> list[Host]:
        hits = [self.hosts[n] for n in self.hosts if fnmatch.fnmatchcase(n, word)]
        if not hits:
            known = ", ".join(self.names()) or "(none)"
            raise UnknownHost(f"no inventory host matches {word!r} (known hosts: {known})")
        return hits

    def expand(self, words: list[str]) -> list[Host]:
        """-H values → hosts, in the order given, each once. A word is an inventory name, `@group`, a glob
        over inventory names (`lab0*`, `gpu[12]`), `user@name:port` (an inventory name with its user or port
        overridden, or an address/ssh_config alias for ssh itself), or several of these separated by commas."""
        out: list[Host] = []
        for word in (w for chunk in words for w in split_words(chunk)):
            if hostrange.is_range(word):  # lab[01-12]: each name as if typed on its own
                out.extend(self.command_line.apply(self.resolve(name), name) for name in hostrange.expand(word))
            elif word.startswith("@"):
                out.extend(self.command_line.apply(h, "") for h in self._group(word))
            elif any(c in word for c in "*?[") and "@" not in word:
                out.extend(self.command_line.apply(h, "") for h in self._glob(word))
            else:
                out.append(self.command_line.apply(self.resolve(word), word))
        seen: set[str] = set()
        return [h for h in out if not (h.name in seen or seen.add(h.name))]

    def targets(self, hosts: list[Host]) -> list[Host]:
        """`hosts`, refused (UnknownHost, before anything connects) when one comes from an example inventory:
        documentation, never a target."""
        examples = [h for h in hosts if h.example]
        if examples:
            first = examples[0]
            raise UnknownHost(f"{first.name} is an example host ({first.source}, a file marked `example: true`), "
                              f"not one of yours: copy it into your own hosts/*.yaml without that line, with your "
                              f"node's address, to use it; this project's other hosts: "
                              f"{', '.join(n for n in self.names() if not self.hosts[n].example) or '(none)'}")
        return hosts

    def limit(self, hosts: list[Host], expr: str) -> list[Host]:
        """--limit: the hosts (in their order) that `expr` selects. Terms are separated by commas; a term is
        a name, a glob (`lab0*`), `@group`, or any of those after `!` to exclude. With only exclusions, every
        host is a candidate. Raises UnknownHost for a term that names no inventory host or group (with a
        "did you mean"), and when nothing is left."""
        include: list[str] = []
        exclude: list[str] = []
        for term in split_words(expr):
            bare = term.lstrip("!").strip()
            for name in hostrange.expand(bare) if hostrange.is_range(bare) else [bare]:
                (exclude if term.startswith("!") else include).append(name)
        if not include and not exclude:
            return list(hosts)
        groups = self.groups()

        def selects(term: str, host: Host) -> bool:
            if term.startswith("@"):
                self._group(term)  # unknown group: an error, never a silent no-match
                return any(fnmatch.fnmatchcase(g, term[1:]) for g in host.groups)
            return fnmatch.fnmatchcase(host.name, term) or fnmatch.fnmatchcase(host.address, term)

        for term in include + exclude:
            plain = not term.startswith("@") and not any(c in term for c in "*?[")
            if plain and term not in self.hosts and not any(term in (h.name, h.address) for h in hosts):
                hint = did_you_mean(term, [*self.hosts, *(f"@{g}" for g in groups)])
                raise UnknownHost(f"--limit names unknown host {term!r}{hint} (known hosts: "
                                  f"{', '.join(self.names()) or '(none)'})")
        chosen = [h for h in hosts if (not include or any(selects(t, h) for t in include))
                  and not any(selects(t, h) for t in exclude)]
        if not chosen:
            raise UnknownHost(f"--limit {expr!r} matches none of the selected hosts "
                              f"({', '.join(h.name for h in hosts) or 'none'})")
        return chosen


class UnknownHost(Exception):
    pass


def split_target(spec: str) -> tuple[str | None, str, int | None]:
    """`user@name:port` → (user, name, port); `[v6addr]:port` too. A bare IPv6 address keeps its colons."""
    user, _, rest = spec.rpartition("@")
    port: str = ""
    if rest.startswith("[") and "]" in rest:
        name, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    elif rest.count(":") == 1:
        name, _, port = rest.partition(":")
    else:
        name = rest
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise UnknownHost(f"not a valid host {spec!r}: port {port!r} must be a number from 1 to 65535")
    return user or None, name, int(port) if port else None


def ssh_config_aliases(path: str | None = None) -> set[str]:
    """The alias set when the caller passed none: names from the same files ssh reads (a -S file or
    $FLEETOPS_SSH_CONFIG alone, else ~/.ssh/config and /etc/ssh/ssh_config, Includes followed)."""
    return sshconfig.host_aliases(sshconfig.config_text(path)[0])


def plain_host(spec: str) -> Host:
    """A word that is not in the inventory: ssh decides, with the user and port the word names (those win
    over ssh_config's, as with `ssh -p`), the rest (HostName, IdentityFile, ProxyJump) from ssh_config."""
    user, address, port = split_target(spec)
    if not (ADDRESS.fullmatch(address) and (not user or USER.fullmatch(user))):
        raise UnknownHost(f"not a valid host {spec!r}: expected name, user@name or user@name:port")
    return Host(name=spec, address=address, port=port or 22, user=user, plain=True,
                source="command line (ssh_config)")


def find_inventory(root: Path, override: str | None = None, default: str = "hosts",
                   environ: Mapping_[str, str] | None = None) -> Path:
    """Which inventory a run uses: `override` (-i/--inventory), else $FLEETOPS_INVENTORY, else
    `root/default` (fabric.yaml's fleetops.inventory, `hosts`). A relative override is taken from the
    current directory first (as typed), then from the project root. A directory (every *.yaml in it) or
    one file. Raises ConfigError naming what was tried when it does not exist."""
    env = os.environ if environ is None else environ
    chosen = override or env.get("FLEETOPS_INVENTORY") or env.get("FABRIC_FLEETOPS_INVENTORY")
    if not chosen:
        return (root / default).resolve()
    where = "--inventory" if override else "FLEETOPS_INVENTORY"
    path = Path(chosen).expanduser()
    tried = [path] if path.is_absolute() else [Path.cwd() / path, root / path]
    for candidate in tried:
        if candidate.exists():
            return candidate.resolve()
    raise ConfigError(chosen, None, f"inventory named by {where} not found (looked at "
                                    f"{', '.join(str(t) for t in dict.fromkeys(tried))}); give a hosts "
                                    "directory or one .yaml file")


def load_inventory(directory: Path, ssh_aliases: frozenset[str] | None = None) -> Inventory:
    """Every *.yaml/*.yml in `directory`, or the one file `directory` names."""
    inv = Inventory(ssh_aliases=ssh_aliases)
    directory = Path(directory)
    files = [directory] if directory.is_file() else sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    for path in files:
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
        raise ConfigError(path, doc.line, "missing required key 'hosts'", doc.column)
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
        merged.key_cols = {**getattr(defaults, "key_cols", {}), **getattr(spec, "key_cols", {})}
        merged.column = spec.column
        inv.hosts[name] = _parse_host(name, merged, path, example)


def _absolute(m: Mapping, key: str, value: str | None, *, home: bool = False) -> str | None:
    """A path field: absolute (`~/` too where `home`), never starting with '-' (it would become an option on a
    command line: `state_dir: "-c"` made the agent command `python -c/bin/...`)."""
    if value is None:
        return None
    expanded = os.path.expanduser(value) if home and value.startswith("~/") else value
    if value.startswith("-") or not expanded.startswith("/"):
        also = " or ~/..." if home else ""
        raise m.error(key, f"{key!r} must be an absolute path (starting with /{also}), got {value!r}")
    return expanded


def _local_path(m: Mapping, key: str) -> str | None:
    value = _absolute(m, key, get_str(m, key), home=True)
    if value is not None and ("\0" in value or not one_line(value)):
        raise m.error(key, f"{key!r} must be one line")
    return value


def _secret_or_plain(m: Mapping, key: str, value: object, what: str) -> tuple[str | None, bool]:
    """A value, or {secret: value} / {secret_from_env: NAME} for one that must never be shown. (None, True):
    a secret_from_env whose variable is not set, recorded in `missing` by the caller."""
    from ..redaction import register

    if isinstance(value, dict):
        if set(value) == {"secret"} and isinstance(value["secret"], (str, int)):
            return register(str(value["secret"])), True
        if set(value) == {"secret_from_env"} and isinstance(value["secret_from_env"], str):
            var = value["secret_from_env"]
            if var not in os.environ:
                return None, True
            return register(os.environ[var]), True
        raise m.error(key, f"{what}: use a plain value, {{secret: ...}} or {{secret_from_env: NAME}}")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise m.error(key, f"{what} must be text")
    return str(value), False


def _unset(where: Mapping, key: str, what: str, value: dict) -> str:
    err = where.error(key, f"{what}: environment variable {value['secret_from_env']} (secret_from_env) is not set "
                           "in this shell; set it and run again (only tasks that need it fail)")
    return str(err)


def _parse_env(m: Mapping, missing: list[tuple[str, str]]) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
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
            missing.append(("env", _unset(where, key if where is raw else "env", f"env {key}", value)))
            secret.add(key)
            continue
        if not one_line(text):
            raise m.error("env", f"env {key}: value must be one line")
        env.append((key, text))
        if is_secret:
            secret.add(key)
    return tuple(env), frozenset(secret)


def _parse_host(name: str, m: Mapping, path: Path, example: bool) -> Host:
    reject_unknown(m, HOST_KEYS, f"host {name!r}")
    for key in ("partition", "account", "gres", "time_limit"):
        if key in m and m.get("scheduler") != "slurm":
            raise m.error(key, f"host {name!r}: {key!r} is a Slurm setting; add 'scheduler: slurm' (a login node)")
    address = get_str(m, "address", required=True, pattern=ADDRESS, describe="a host name or IP address")
    python = get_str(m, "python", default="python3", pattern=REMOTE_PATH,
                     describe="an absolute path to the venv's python, no spaces, quotes or '..'")
    if python != "python3":
        _absolute(m, "python", python)
    state_dir = get_str(m, "state_dir", pattern=REMOTE_PATH, describe="a path with no spaces, quotes or '..'")
    become = get_str(m, "become", pattern=BECOME, describe="'sudo' (or leave it out: the login user runs the agent)")
    # the default: in the login's home, or root's own with become
    state_dir = _absolute(m, "state_dir", state_dir) or (BECOME_STATE_DIR if become else DEFAULT_STATE_DIR)
    groups = get_str_list(m, "groups", pattern=GROUP, describe="group names are plain words")
    missing: list[tuple[str, str]] = []
    env, secret_env = _parse_env(m, missing)
    passphrase = None
    if "identity_passphrase" in m:
        passphrase, _ = _secret_or_plain(m, "identity_passphrase", m["identity_passphrase"], "identity_passphrase")
        if passphrase is None:
            missing.append(("identity_passphrase", _unset(m, "identity_passphrase", "identity_passphrase",
                                                          m["identity_passphrase"])))
        from ..redaction import register

        register(passphrase or "")  # a passphrase is secret even when written as a plain value
    return Host(
        name=name,
        address=address,
        port=get_int(m, "port", default=22, minimum=1, maximum=65535),
        user=get_str(m, "user", pattern=USER, describe="a plain user name"),
        identity_file=_local_path(m, "identity_file"),
        known_hosts=_local_path(m, "known_hosts"),
        jump=get_str(m, "jump", pattern=JUMP, describe="an inventory name or user@host:port"),
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
        scheduler=get_str(m, "scheduler", pattern=SCHEDULER, describe="'slurm' (or leave it out for plain SSH)"),
        partition=get_str(m, "partition", pattern=PARTITION, describe="a Slurm partition name"),
        account=get_str(m, "account", pattern=ACCOUNT, describe="a Slurm account name"),
        gres=get_str(m, "gres", pattern=GRES, describe="a Slurm gres such as gpu:8 or gpu:h200:8"),
        time_limit=get_str(m, "time_limit", pattern=TIME_LIMIT,
                           describe="a Slurm time limit: minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED"),
        slurm_node=get_str(m, "slurm_node", pattern=NAME, describe="the host's node name in Slurm (one name)"),
        become=become,
    )
