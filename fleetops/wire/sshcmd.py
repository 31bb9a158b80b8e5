"""The system `ssh`'s command line for one host: the inventory's settings as ssh's own options
(strict host keys against the inventory's known_hosts, only the inventory's key, batch mode, the
connect timeout), the master connection's ControlPath in the control directory (controldir.py), and
a jump host as a ProxyCommand that runs `ssh -W` with the jump host's own settings (its key and
known_hosts, which `-J` cannot carry). Always a list: no local shell reads it, and the remote
command is one word, quoted word by word (shlex) as the paramiko transport quotes it. ssh reads
ssh_config itself, so a host outside the inventory is what `ssh` makes of it."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from ..plans.host import MAX_PERSIST, Host, UnknownHost, split_target
from ..plans.inventory import Inventory
from ..plans.jumphost import jump_of
from . import sshgcache
from .connector import TransportError
from .fabconfig import config_file, plain_keys

# seconds a master outlives its last use, unless the inventory says `persist:`
DEFAULT_PERSIST = 600
# `persist: 0`: the master lives for the run (closed at its end), this long after a crash
OFF_PERSIST = 5
MAX_JUMPS = 8
SSH_G_TIMEOUT = 10.0
# True while only stored `ssh -G` answers may be used (stored_answers_only)
_STORED_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("stored_only", default=False)


def ssh_binary() -> str:
    found = shutil.which("ssh")
    if found is None:
        raise TransportError(
            "refused",
            "the openssh transport needs OpenSSH's `ssh` on PATH (none found); install "
            "openssh-client, or use `transport: paramiko`",
        )
    return found


def persist_of(host: Host) -> int:
    """Seconds this host's master outlives its last use (0: not after this run)."""
    return DEFAULT_PERSIST if host.persist is None else min(host.persist, MAX_PERSIST)


@dataclass(frozen=True)
class Target:
    """How `ssh` names the host: the word it connects to and the -l / -p that go with it (None:
    ssh_config's)."""

    word: str
    user: str | None
    port: int | None


def target_of(host: Host) -> Target:
    if host.plain:
        user, name, port = split_target(host.name)
        return Target(name, user, port)
    return Target(host.address, host.user, host.port)


def _escape(word: str) -> str:
    """A word of a ProxyCommand: ssh expands %-tokens in it, so a literal % is doubled."""
    return word.replace("%", "%%")


def base_options(
    host: Host, inventory: Inventory | None, control: str | None, depth: int = 0
) -> list[str]:
    """Every option of `ssh` for this host but the master's own (ControlMaster / ControlPersist),
    then its target words: `[...options, "-l", user, "-p", port, "--", word]`. `control`: its
    ControlPath."""
    binary = ssh_binary()
    options = [
        binary,
        "-T",
        "-x",
        "-a",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"ConnectTimeout={host.connect_timeout}",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
    ]
    named = config_file()
    if named:
        options += ["-F", named]
    if host.known_hosts:
        options += ["-o", f"UserKnownHostsFile={host.known_hosts}"]
    if host.identity_file:
        options += ["-i", host.identity_file, "-o", "IdentitiesOnly=yes"]
    elif host.plain:
        for key in plain_keys():
            options += ["-i", key]
    if control is not None:
        options += ["-o", f"ControlPath={control}"]
    if host.jump and not host.plain:
        if depth >= MAX_JUMPS:
            raise TransportError("unreachable", f"jump chain too long at {host.name}")
        try:
            jump = jump_of(host, inventory)
        except UnknownHost as exc:
            raise TransportError("refused", f"{host.name}: its jump host: {exc}") from None
        # The hop's connection lives inside the target's master (no master of its own to mix
        # identities up)
        hop = base_options(jump, inventory, None, depth + 1)
        words = [_escape(w) for w in hop[:-2]] + [
            "-o",
            "ControlMaster=no",
            "-W",
            "%h:%p",
            "--",
            _escape(hop[-1]),
        ]
        options += ["-o", f"ProxyCommand={shlex.join(words)}"]
    target = target_of(host)
    if target.user:
        options += ["-l", target.user]
    if target.port:
        options += ["-p", str(target.port)]
    return [*options, "--", target.word]


def identity_digest(argv: list[str]) -> str:
    """A hash of everything that decides whom a command line logs in as and how it checks the node:
    its options but the ControlPath, with the ssh_config file it names (-F) by its content."""
    words = []
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word == "-o" and i + 1 < len(argv) and argv[i + 1].startswith("ControlPath="):
            skip = True
            continue
        if i and argv[i - 1] == "-F":
            try:
                with open(word, "rb") as f:
                    word = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                pass
        words.append(word)
    return hashlib.sha256("\0".join(words).encode()).hexdigest()


def with_options(argv: list[str], *extra: str) -> list[str]:
    """argv (base_options' shape) with more options before its target words."""
    return [*argv[:-2], *extra, *argv[-2:]]


def resolved_all(argv: list[str]) -> dict[str, list[str]]:
    """What ssh makes of this command line (`ssh -G`, from the store when provably the same, see
    sshgcache.py): every value of each key, in ssh's order (a key such as certificatefile may be
    given several times). {} when ssh cannot say."""
    out = sshgcache.lookup(with_options(argv, "-G"), _no_ssh if _STORED_ONLY.get() else _ssh_g)
    if out is None:
        return {}
    found: dict[str, list[str]] = {}
    for line in out.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, []).append(value)
    return found


@contextlib.contextmanager
def stored_answers_only() -> Iterator[None]:
    """Within it, resolved_all() answers from the store only ({} where it would start `ssh -G`): for
    work that is worth doing only when it costs no process (wire/warmstart.py)."""
    token = _STORED_ONLY.set(True)
    try:
        yield
    finally:
        _STORED_ONLY.reset(token)


def _no_ssh(argv: list[str]) -> bytes | None:
    return None


def _ssh_g(argv: list[str]) -> bytes | None:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SSH_G_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def proxyjump_loop(host: Host, argv: list[str], settings: dict[str, str]) -> TransportError | None:
    """An ssh_config ProxyJump chain that comes back to a host already on it, or runs past MAX_JUMPS
    hops, as a refusal; None when the chain ends. ssh itself follows such a loop without end,
    starting one `ssh -W` after another, so it is never handed one. Each hop is resolved as ssh
    resolves it (`ssh -G`, its -F kept)."""
    trail: list[tuple[str, str, str]] = []
    config = argv[argv.index("-F") + 1] if "-F" in argv[:-2] else None
    binary = argv[0]
    while True:
        here = (settings.get("hostname", ""), settings.get("port", ""), settings.get("user", ""))
        if here in trail or len(trail) > MAX_JUMPS:
            path = " -> ".join(f"{u}@{h}:{p}" for h, p, u in (*trail, here))
            what = (
                "ProxyJump loop"
                if here in trail
                else f"ProxyJump chain longer than {MAX_JUMPS} hops"
            )
            return TransportError(
                "refused",
                f"{host.name}: ssh_config {what}: {path}; fix ProxyJump in "
                "ssh_config (`ProxyJump none` in the jump host's own entry ends a chain)",
            )
        trail.append(here)
        jump = settings.get("proxyjump", "none")
        if jump == "none" or not jump:
            return None
        # `ProxyJump a,b`: ssh reaches b through a (`-J a`), so only the first hop's own ssh_config
        # goes on
        try:
            user, name, port = split_target(jump.split(",")[0].strip())
        except UnknownHost:
            return None  # ssh names the bad word itself
        hop = [
            binary,
            *(["-F", config] if config else []),
            *(["-l", user] if user else []),
            *(["-p", str(port)] if port else []),
            "--",
            name,
        ]
        settings = resolved(hop)
        if not settings:
            return None  # ssh cannot read that hop: it says why when it tries


def offered_certificates(argv: list[str]) -> tuple[str, list[str]]:
    """The login name and the certificates ssh offers on this command line: `ssh -G`'s user and its
    CertificateFile lines that exist."""
    settings = resolved_all(argv)
    files = [os.path.expanduser(f) for f in settings.get("certificatefile", [])]
    return (settings.get("user") or [""])[0], [f for f in files if os.path.isfile(f)]


def resolved(argv: list[str]) -> dict[str, str]:
    """What ssh makes of this command line (`ssh -G`): each key's first value (controlpath expanded
    with %C: a hash of local host, host, port, user and jump). {} when ssh cannot say (its complaint
    comes again, and is read, when the connection is made)."""
    return {key: values[0] for key, values in resolved_all(argv).items()}
