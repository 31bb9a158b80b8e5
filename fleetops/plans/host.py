"""A host as fleetops reaches it: the Host record, the -H word's parts (`user@name:port`), a host
outside the inventory (`plain_host`), and what the command line overrides for every host
(CommandLine). Also the patterns an inventory value must match (NAME, ADDRESS, USER, ...): every
value that later reaches a remote command line is checked against one of them
(plans/inventoryfile.py reads the files), and `plain_host` checks a -H word against the same ones.

Its own module so a task, the wire or a report can name a Host without the inventory's reading and
selection."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:]{2,39}")
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
GROUP = NAME
SCHEDULER = re.compile(r"slurm")
JUMP = re.compile(
    r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::[0-9]{1,5})?"
)
DEFAULT_STATE_DIR = ".fleetops"  # relative: the node's exec starts in the login user's home
# With become, root runs the agent: its state dir must be root's (the bootstrap refuses one the
# login user owns, who could swap what root runs), so the default moves out of the login user's
# home.
BECOME_STATE_DIR = "/var/lib/fleetops"
BECOME = re.compile(r"sudo")
TRANSPORT = re.compile(r"openssh|paramiko")
MAX_PERSIST = 3600  # seconds an idle master connection may outlive its run (`persist:`)
MAX_MASTERS_CAP = 100_000  # the most `max_masters:` may say


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
    # Secrets this host names but could not get ({secret_from_env: VAR} with VAR unset): (what,
    # message). Only this host's tasks that need them fail; reading env / identity_passphrase raises
    # MissingSecret.
    missing_secrets: tuple[tuple[str, str], ...] = ()
    # scheduler "slurm": a login node; jobs go through sbatch (partition/account/gres/time_limit as
    # given)
    scheduler: str | None = None
    partition: str | None = None
    account: str | None = None
    gres: str | None = None
    time_limit: str | None = None
    # the host is this node of a Slurm cluster (drain/undrain: scontrol update)
    slurm_node: str | None = None
    become: str | None = None  # "sudo": the agent runs as root through sudo (wire/become.py)
    # `jump:` written as a mapping (JUMP_KEYS); `jump` then holds its user@address:port
    # (plans/jumps.py)
    jump_host: Host | None = field(default=None, repr=False)
    # "openssh" (the system `ssh`, wire/openssh.py) or "paramiko" (wire/node.py); None: the run's
    # choice
    transport: str | None = None
    # openssh: seconds a master outlives its last use (0: none after the run)
    persist: int | None = None
    # openssh: how many masters may persist (`defaults: max_masters:`)
    max_masters: int | None = None

    @property
    def label(self) -> str:
        return self.name

    def secret_problems(self, need_env: bool = True) -> list[str]:
        """Why this host cannot run a task: its key's passphrase (every task) or, when `need_env` (a
        task that starts a job), a job environment secret could not be read. [] when nothing is
        missing."""
        return [msg for what, msg in self.missing_secrets if need_env or what != "env"]

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """Added to job environments. Raises MissingSecret when a secret among them could not be
        read, so a job never starts without its token (and no other host or task is affected)."""
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
    """A host's secret (secret_from_env) is not set in this process: that host's tasks that need it
    fail."""


@dataclass(frozen=True)
class CommandLine:
    """What the command line says for every host of the run: -u/--user, --port, -i (one key) and
    -t/--connect-timeout. The command line wins over the inventory and ssh_config, as ssh's own -l,
    -p, -i and -o ConnectTimeout do; a user or port written in the -H word itself
    (`root@lab01:2222`) wins over both. For a host outside the inventory the user and port join its
    -H word (ssh_config decides the rest) and -i is offered by the connection (wire/fabconfig.py); a
    jump host keeps its own settings."""

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
            spec = join_target(user or self.user, name, port or self.port)
            return replace(plain_host(spec) if spec != host.name else host, connect_timeout=timeout)
        changed = replace(
            host,
            user=word_user or self.user or host.user,
            port=word_port or self.port or host.port,
            connect_timeout=timeout,
        )
        return self._with_key(changed) if self.identity_files else changed

    def _with_key(self, host: Host) -> Host:
        """An inventory host with the one key -i names instead of its own."""
        if len(self.identity_files) > 1:
            raise UnknownHost(
                f"-i names {len(self.identity_files)} keys; {host.name} is an inventory host, "
                "which logs in with one key: give one -i "
                "(a host outside the inventory tries each)"
            )
        # The inventory's passphrase was for its own key, not this one.
        return replace(
            host,
            identity_file=os.path.expanduser(self.identity_files[0]),
            passphrase=None,
            missing_secrets=tuple(m for m in host.missing_secrets if m[0] != "identity_passphrase"),
        )


def join_target(user: str | None, name: str, port: int | None) -> str:
    """(user, name, port) → `user@name:port`, an IPv6 address in brackets when a port follows it."""
    where = f"[{name}]:{port}" if port and ":" in name else f"{name}:{port}" if port else name
    return f"{user}@{where}" if user else where


class UnknownHost(Exception):
    pass


def split_target(spec: str) -> tuple[str | None, str, int | None]:
    """`user@name:port` → (user, name, port); `[v6addr]:port` too. A bare IPv6 address keeps its
    colons."""
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
        raise UnknownHost(
            f"not a valid host {spec!r}: port {port!r} must be a number from 1 to 65535"
        )
    return user or None, name, int(port) if port else None


def plain_host(spec: str) -> Host:
    """A word that is not in the inventory: ssh decides, with the user and port the word names
    (those win over ssh_config's, as with `ssh -p`), the rest (HostName, IdentityFile, ProxyJump)
    from ssh_config."""
    user, address, port = split_target(spec)
    if not (ADDRESS.fullmatch(address) and (not user or USER.fullmatch(user))):
        raise UnknownHost(f"not a valid host {spec!r}: expected name, user@name or user@name:port")
    return Host(
        name=spec,
        address=address,
        port=port or 22,
        user=user,
        plain=True,
        source="command line (ssh_config)",
    )
