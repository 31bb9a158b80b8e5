"""The OpenSSH transport's identity files, checked before a master is started as the paramiko
transport checks them (wire/keys.py), with the same words: a missing identity_file or -i key, an
encrypted key that no passphrase was given for (and that ssh-agent does not hold), a wrong
passphrase. A passphrase given (identity_passphrase, or typed at --prompt-for-passphrase) reaches
the master's `ssh` through SSH_ASKPASS: a program in the control directory that prints a variable
only that ssh's environment carries (never an argv word, never a file), tried first with `ssh-keygen
-y` so a wrong one is named before any connection. Without a passphrase, ssh runs in batch mode and
never asks.

Nothing here imports paramiko, cryptography or Fabric."""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from ..plans.host import Host, MissingSecret, UnknownHost
from ..plans.inventory import Inventory
from ..plans.jumphost import jump_of
from . import controldir
from .connector import TransportError
from .fabconfig import any_typed, host_resolution, plain_keys, typed_passphrase
from .keyfile import (
    encrypted,
    missing_identity,
    no_passphrase,
    public_blob,
    unreadable_key,
    wrong_passphrase,
)

# what the askpass program prints: set only in the environment of the ssh (or ssh-keygen) it serves
SECRET_ENV = "FLEETOPS_KEY_PASSPHRASE"
# SSH_ASKPASS_REQUIRE=force (askpass without a DISPLAY, and before the terminal) came in 8.4
MIN_ASKPASS_VERSION = (8, 4)
CHECK_TIMEOUT = 30.0  # ssh-keygen decrypts a local file; ssh-add -L asks a local socket
# ssh asks the passphrase of each key once, and never for a password or a keyboard answer
ASKING_OPTIONS = (
    "PasswordAuthentication=no",
    "KbdInteractiveAuthentication=no",
    "NumberOfPasswordPrompts=1",
)


@dataclass(frozen=True)
class Login:
    """How the master's `ssh` logs in: in batch mode (env None: the process's own environment), or
    with askpass handing it one key's passphrase (env: its whole environment). `target`: the
    master's own login asks (else only its jump host's hop does); `hop`: the inventory jump host's
    hop asks for its own key's passphrase, carried in JUMP_SECRET_ENV."""

    env: dict[str, str] | None = None
    target: bool = True
    hop: bool = False

    def argv(self, argv: list[str]) -> list[str]:
        """The master's command line (sshcmd.base_options' shape) for this login: batch mode off
        and the asking options, when a passphrase is handed over."""
        if self.hop:
            argv = asking_hop(argv)
        if self.env is None or not self.target:
            return argv
        return _asking(argv)


BATCH = Login()
# the jump host's passphrase, in the master's environment: its hop's shell hands it to the hop's
# `ssh` as SECRET_ENV, which the askpass program prints
JUMP_SECRET_ENV = "FLEETOPS_JUMP_KEY_PASSPHRASE"
HOP_SCRIPT = f'{SECRET_ENV}="${JUMP_SECRET_ENV}" exec "$@"'


def _asking(argv: list[str]) -> list[str]:
    """An ssh command line (base_options' shape: its target words last) that may ask askpass."""
    # ssh keeps the first value of an option: BatchMode=yes is replaced, not followed
    argv = ["BatchMode=no" if word == "BatchMode=yes" else word for word in argv]
    extra = [w for option in ASKING_OPTIONS for w in ("-o", option)]
    return [*argv[:-2], *extra, *argv[-2:]]


def asking_hop(argv: list[str]) -> list[str]:
    """argv with its ProxyCommand (the inventory jump host's hop, `ssh ... -W %h:%p -- JUMP`) made
    to ask askpass for the jump's key: through `sh -c`, which sets SECRET_ENV from JUMP_SECRET_ENV
    for that ssh alone. Both stay in the environment: no passphrase is in any argv."""
    out = list(argv)
    for i, word in enumerate(out):
        if i and out[i - 1] == "-o" and word.startswith("ProxyCommand="):
            hop = _asking(shlex.split(word.removeprefix("ProxyCommand=")))
            out[i] = "ProxyCommand=" + shlex.join(["sh", "-c", HOP_SCRIPT, "sh", *hop])
            break
    return out


def with_jump(login: Login, host: Host, inventory: Inventory | None) -> Login:
    """`login` with the inventory jump host's own: its key checked as the target's are (a missing
    file, an unset or wrong passphrase named, the jump host with it), and its passphrase handed to
    the hop's ssh when it needs one."""
    if not host.jump or host.plain:
        return login
    try:
        jump = jump_of(host, inventory)
    except UnknownHost:
        return login  # named when the command line is made
    try:
        hop = _login_of(jump)
    except TransportError as exc:
        raise TransportError(exc.kind, f"{host.name}: its jump host {exc}") from None
    if hop.env is None:
        return login
    env = dict(login.env if login.env is not None else os.environ)
    env.update(
        SSH_ASKPASS=hop.env["SSH_ASKPASS"],
        SSH_ASKPASS_REQUIRE="force",
        **{JUMP_SECRET_ENV: hop.env[SECRET_ENV]},
    )
    return Login(env, target=login.env is not None, hop=True)


def named_keys(host: Host) -> list[tuple[str, str]]:
    """The identity files this host names that must be there, each with where it is named: the
    inventory's identity_file, or fab -i's keys for a host outside the inventory. Raises the
    TransportError of a missing one, and MissingSecret for an identity_passphrase whose variable
    is unset (read here, as the paramiko transport reads it, so the host fails naming it)."""
    if host.plain:
        named = [(key, "fab -i") for key in plain_keys()]
    elif host.identity_file:
        host.identity_passphrase  # noqa: B018 (read for its MissingSecret)
        named = [(host.identity_file, "identity_file in the inventory")]
    else:
        named = []
    for path, where in named:
        missing = missing_identity(host.name, path, where)
        if missing is not None:
            raise missing
    return named


def login(host: Host, inventory: Inventory | None = None) -> Login:
    """How this host's master logs in (_login_of), its inventory jump host's own key included
    (with_jump)."""
    return with_jump(_login_of(host), host, inventory)


def _login_of(host: Host) -> Login:
    """How this host's master logs in, each key named checked first (raises TransportError "auth"
    as the paramiko transport does, or MissingSecret). An inventory key that is encrypted, not in
    ssh-agent and has no passphrase is refused; -i keys and ssh_config's IdentityFile are offered
    as ssh offers them, one passphrase typed at --prompt-for-passphrase going to the first
    encrypted one it fits."""
    named = named_keys(host)
    if host.plain:
        return _plain_login(host, [os.path.expanduser(k) for k, _ in named])
    if not named:
        return BATCH
    path = os.path.expanduser(named[0][0])
    if encrypted(path) is not True or agent_holds(path):
        return BATCH
    passphrase = host.identity_passphrase or typed_passphrase(path)
    if not passphrase:
        raise no_passphrase(host.name, named[0][0])
    return asking(host.name, path, passphrase)


def _plain_login(host: Host, paths: list[str]) -> Login:
    """A host outside the inventory: the first of its -i keys and ssh_config IdentityFiles that is
    encrypted, not in ssh-agent and was given a passphrase at --prompt-for-passphrase gets it (ssh
    offers the rest as it would)."""
    if not any_typed():
        return BATCH
    try:
        found = host_resolution(host).get("identityfile") or []
    except TransportError:  # ssh rejects its ssh_config: said when the master starts
        found = []
    paths += [os.path.expanduser(f) for f in found if os.path.isfile(os.path.expanduser(f))]
    for path in paths:
        typed = typed_passphrase(path)
        if typed and encrypted(path) and not agent_holds(path):
            return asking(host.name, path, typed)
    return BATCH


def asking(who: str, path: str, passphrase: str) -> Login:
    """A login that hands `passphrase` to ssh through askpass, once `ssh-keygen -y` opened the key
    with it the same way (raises the wrong-passphrase TransportError before any connection)."""
    refused = version_refusal(who, path, ssh_version())
    if refused is not None:
        raise refused
    try:
        script = controldir.askpass_script(controldir.control_dir(), SECRET_ENV)
    except (controldir.ControlDirError, OSError) as exc:
        raise TransportError("refused", f"{who}: {exc}") from None
    env = {
        **os.environ,
        "SSH_ASKPASS": script,
        "SSH_ASKPASS_REQUIRE": "force",
        SECRET_ENV: passphrase,
    }
    keygen = shutil.which("ssh-keygen") or "ssh-keygen"
    try:
        done = subprocess.run(
            [keygen, "-y", "-f", path],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=CHECK_TIMEOUT,
            check=False,
            start_new_session=True,  # no terminal to ask at: askpass only
        )
    except subprocess.TimeoutExpired:
        raise unreadable_key(
            who, path, f"ssh-keygen -y did not finish in {CHECK_TIMEOUT:g}s"
        ) from None
    except OSError as exc:
        raise unreadable_key(who, path, f"cannot run ssh-keygen: {exc.strerror or exc}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.decode("utf-8", "replace").split())
        if "passphrase" in said.lower():
            raise wrong_passphrase(who, path)
        raise unreadable_key(who, path, said or f"ssh-keygen exit status {done.returncode}")
    return Login(env)


def keys_to_ask(
    hosts: list[Host], holds: Callable[[str], bool] | None = None
) -> dict[str, list[str]]:
    """--prompt-for-passphrase: the key files these hosts log in with that need a passphrase typed
    (encrypted, not held by ssh-agent, no identity_passphrase of their own), each with the hosts
    that use it. A key that is not encrypted is never asked for, nor given one. `holds`: whether
    ssh-agent holds a key file's key (default: `ssh-add -L`, without paramiko)."""
    holds = holds or agent_holds
    wanted: dict[str, list[str]] = {}
    for host in hosts:
        if host.plain:
            try:
                found = host_resolution(host).get("identityfile") or []
            except TransportError:  # ssh rejects its ssh_config: that host's own error says so
                found = []
            paths = [*plain_keys(), *found]
        else:
            try:
                if host.identity_passphrase or not host.identity_file:
                    continue
            except MissingSecret:  # its own passphrase, unset: that host's error says so
                continue
            paths = [host.identity_file]
        for path in paths:
            real = os.path.realpath(os.path.expanduser(path))
            if os.path.isfile(real) and encrypted(real) is True and not holds(real):
                names = wanted.setdefault(real, [])
                if host.name not in names:
                    names.append(host.name)
    return wanted


def agent_holds(path: str) -> bool:
    """Whether ssh-agent (SSH_AUTH_SOCK) holds the key of this file: its public half (PATH.pub, or
    the file's clear header) among `ssh-add -L`'s."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return False
    blob = public_blob(path)
    if blob is None:
        return False
    try:
        done = subprocess.run(
            [shutil.which("ssh-add") or "ssh-add", "-L"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    # an agent that is gone or does not answer: as without one
    except (OSError, subprocess.TimeoutExpired):
        return False
    for line in done.stdout.decode("utf-8", "replace").splitlines() if done.returncode == 0 else []:
        words = line.split()
        try:
            if len(words) >= 2 and base64.b64decode(words[1], validate=True) == blob:
                return True
        except (binascii.Error, ValueError):
            continue
    return False


@functools.cache
def ssh_version() -> tuple[int, int] | None:
    """OpenSSH's version (`ssh -V`), asked once; None when it does not say."""
    try:
        done = subprocess.run(
            [shutil.which("ssh") or "ssh", "-V"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(rb"OpenSSH_(\d+)\.(\d+)", done.stderr + done.stdout)
    return (int(found[1]), int(found[2])) if found else None


def version_refusal(who: str, path: str, version: tuple[int, int] | None) -> TransportError | None:
    """The refusal to hand a passphrase to an `ssh` of this version (None: it can be)."""
    if version is not None and version >= MIN_ASKPASS_VERSION:
        return None
    shown = "an unknown version" if version is None else "%d.%d" % version
    return TransportError(
        "refused",
        f"{who}: the passphrase of {path} can be handed to `ssh` only by OpenSSH "
        f"{'.'.join(map(str, MIN_ASKPASS_VERSION))} or later (SSH_ASKPASS_REQUIRE), and "
        f"this is {shown}; load the key into ssh-agent (ssh-add {path}), or use "
        "`transport: paramiko`",
    )
