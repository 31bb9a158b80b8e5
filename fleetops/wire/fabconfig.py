"""ssh_config and Fabric's Config: the file a run connects with (fab -S, -i), each host word
resolved by OpenSSH itself (`ssh -G`, once per word and options per run), and the process's one
Fabric Config, shared read-only by every connection. Without an `ssh` binary, paramiko's reading of
the same files stands in, and one warning names every directive it does not apply. paramiko and
Fabric are imported only when a paramiko connection needs them (or, without `ssh`, to read the
files): a run reads them as text (their names for -H words; `ssh -G` reads the rest), so one whose
hosts all use the system `ssh` (wire/openssh.py), or that stops before connecting, loads neither."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from ..plans import sshconfig, sshresolve
from ..plans.host import Host, split_target
from ..plans.yamlsrc import ConfigError
from . import keyfile
from .connector import TransportError

if TYPE_CHECKING:
    import paramiko
    from fabric import Config

_LOCK = threading.Lock()
_CONFIG: Any = None  # the _SharedConfig, made on first use by a paramiko connection
_SSH_CONFIG_PATH: str | None = None  # fab -S FILE, set by use_ssh_config()
_PLAIN_KEYS: tuple[str, ...] = ()  # fab -i KEY: offered to hosts outside the inventory
# one passphrase for every encrypted key (use_ssh_config's, the library's)
_TYPED_PASSPHRASE: str | None = None
# --prompt-for-passphrase: what was typed for each encrypted key
_KEY_PASSPHRASES: dict[str, str] = {}
# the `ssh` that resolves host words; None: paramiko's reading (the fallback)
_SSH_BINARY: str | None = None
_FALLBACK: paramiko.SSHConfig | None = None  # paramiko's reading, used only without an `ssh` binary
_FALLBACK_WARNING: str | None = None
# this run's answers, per word and options
_RESOLVED: dict[tuple[str, tuple[tuple[str, str], ...]], dict] = {}
_LOCAL: sshresolve.Local | None = None
# ($HOME's ssh_config, the file that includes it for ssh)
_HOME_CONFIG: tuple[str, str] | None = None
SSH_G_TIMEOUT = 10.0  # `ssh -G` reads files; a `Match exec` may run a command, never the network


def use_ssh_config(
    path: str | None,
    identity_files: list[str] | tuple[str, ...] = (),
    passphrase: str | None = None,
    paramiko_reads: bool = True,
) -> frozenset[str]:
    """Connect with this ssh_config file from now on (Fabric's -S; None: $FLEETOPS_SSH_CONFIG, else
    ~/.ssh/config and /etc/ssh/ssh_config), Includes followed; `identity_files` (Fabric's -i) are
    offered to hosts outside the inventory, before ssh_config's IdentityFile (an inventory host uses
    its own key). Returns the names the file defines, for `load_inventory(..., ssh_aliases=...)`, so
    those names are -H words. `passphrase` (Fabric's --prompt-for-passphrase) opens encrypted
    identity files that have no identity_passphrase of their own. Raises ConfigError (usage, exit 2)
    when the file is missing, or unparsable where paramiko is to read it. `paramiko_reads`: False
    when no host of the run uses paramiko. paramiko parses the file only where it resolves hosts
    (no `ssh` binary); otherwise the text alone is read here and paramiko is not imported: `ssh -G`
    reads the rest, and a paramiko connection makes Fabric's Config when it first needs it."""
    global _CONFIG, _SSH_CONFIG_PATH, _PLAIN_KEYS, _TYPED_PASSPHRASE
    text = sshconfig.config_text(path)[0]
    binary = shutil.which("ssh")
    fallback = _parse(path, text) if paramiko_reads and binary is None else None
    with _LOCK:
        _SSH_CONFIG_PATH = path
        _CONFIG = None
        _use_resolver(binary, fallback, text)
        _PLAIN_KEYS = tuple(os.path.expanduser(k) for k in identity_files)
        _TYPED_PASSPHRASE = passphrase or None
    # from the text: paramiko's public get_hostnames() fails on a config with a Match block
    return frozenset(sshconfig.host_aliases(text))


def _parse(path: str | None, text: str) -> paramiko.SSHConfig:
    """paramiko's reading of the text (the resolver without an `ssh` binary)."""
    import paramiko

    try:
        return paramiko.SSHConfig.from_text(text)
    except paramiko.ssh_exception.ConfigParseError as exc:
        raise ConfigError(
            sshconfig.chosen_path(path) or "ssh_config",
            None,
            f"cannot parse ssh_config: {exc}",
        ) from None


# the -S path the resolver's files were read for (_UNREAD: none yet); a caller that names another
# path (use_ssh_config, or a test putting its previous choice back) has them read again
_UNREAD = object()
_READ_FOR: object = _UNREAD


def _use_resolver(binary: str | None, fallback: paramiko.SSHConfig | None, text: str) -> None:
    """Under _LOCK: `ssh` (binary) resolves from now on; without it, paramiko's reading
    (fallback), and the warning."""
    global _SSH_BINARY, _FALLBACK, _FALLBACK_WARNING, _READ_FOR
    _RESOLVED.clear()
    _SSH_BINARY = binary
    _FALLBACK, _FALLBACK_WARNING, _READ_FOR = fallback, None, _SSH_CONFIG_PATH
    if _SSH_BINARY is None:
        skipped = sshresolve.not_applied(text)
        if skipped:
            _FALLBACK_WARNING = (
                f"no `ssh` on PATH: ssh_config read by paramiko, which does not apply "
                f"{', '.join(skipped)}; install OpenSSH's client for ssh's own reading"
            )


def _read_files() -> None:
    """The files read once for the resolver, if use_ssh_config() has not (a library caller): a
    missing or unparsable file refuses the host."""
    with _LOCK:
        if _READ_FOR == _SSH_CONFIG_PATH:
            return
        try:
            text = sshconfig.config_text(_SSH_CONFIG_PATH)[0]
            binary = shutil.which("ssh")
            _use_resolver(binary, _parse(_SSH_CONFIG_PATH, text) if binary is None else None, text)
        except ConfigError as exc:
            raise TransportError("refused", f"{exc}; fix or name another file with -S") from None


def fallback_warning() -> str | None:
    """The one line saying which ssh_config directives are not applied (only without an `ssh`
    binary)."""
    return _FALLBACK_WARNING


def resolve(word: str, user: str | None = None, port: int | None = None) -> dict:
    """`word`'s settings as `ssh` would connect with them (HostName, User, Port, IdentityFile,
    CertificateFile, ProxyJump, ProxyCommand, IdentitiesOnly, UserKnownHostsFile), in paramiko's
    lookup shape with every token expanded; `user` and `port` (the inventory's or the command
    line's) are passed as `-o`, and win as they do on ssh's command line. Asked once per word and
    values per run. Raises TransportError ("refused") naming the word and ssh's own complaint when
    ssh rejects the configuration."""
    global _LOCAL
    options = tuple((k, str(v)) for k, v in (("User", user), ("Port", port)) if v)
    key = (word, options)
    _read_files()
    with _LOCK:
        found = _RESOLVED.get(key)
        binary, fallback = _SSH_BINARY, _FALLBACK
        if _LOCAL is None:
            _LOCAL = sshresolve.local_side()
        local = _LOCAL
    if found is not None:
        return found
    if binary is None:
        found = dict(fallback.lookup(word) if fallback is not None else {})
        found.update({k.lower(): v for k, v in options})
    else:
        found = sshresolve.lookup_dict(_ssh_g(binary, word, options), local)
    with _LOCK:
        return _RESOLVED.setdefault(key, found)


def host_resolution(host: Host) -> dict:
    """resolve() for a host: a -H word outside the inventory with the user and port it names (`ssh
    user@name -p port`), an inventory host's address with its user and port."""
    if host.plain:
        user, name, port = split_target(host.name)
        return resolve(name, user, port)
    return resolve(host.address, host.user, host.port)


def _home_config() -> str | None:
    """None when ssh reads the same files fleetops names (~/.ssh/config, then /etc/ssh/ssh_config).
    ssh takes ~ from the password database, fleetops from $HOME; where they differ (a test's own
    HOME, `sudo -E`), a file of this process's own that includes $HOME's file then the system's, in
    that order, so ssh reads those."""
    global _HOME_CONFIG
    try:
        import pwd

        own = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return None
    user = str(sshconfig.user_config())
    if os.path.realpath(user) == os.path.realpath(os.path.join(own, ".ssh", "config")):
        return None
    with _LOCK:
        if _HOME_CONFIG is None or _HOME_CONFIG[0] != user:
            folder = tempfile.mkdtemp(prefix="fleetops-ssh-")  # 0700, this user's
            path = os.path.join(folder, "config")
            # ssh's own default known_hosts is also under the password database's home: $HOME's, as
            # fleetops reads it, comes last (ssh_config's first value wins, so a UserKnownHostsFile
            # of the files stands)
            known = os.path.join(os.path.dirname(os.path.dirname(user)), ".ssh", "known_hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write(
                    f'Include "{user}"\nInclude "{sshconfig.SYSTEM_CONFIG}"\n'
                    f'Host *\n  UserKnownHostsFile "{known}"\n'
                )
            atexit.register(shutil.rmtree, folder, True)
            _HOME_CONFIG = (user, path)
        return _HOME_CONFIG[1]


# `ssh -G`s running at once: each holds up to 6 of the client's file descriptors while it starts
# (its pipes and the exec's error pipe), counted in connector.FDS_KEPT; it is CPU-bound, so more at
# once would not be faster.
SSH_G_AT_ONCE = 8
_SSH_G_SLOTS = threading.BoundedSemaphore(SSH_G_AT_ONCE)


def _ssh_g(binary: str, word: str, options: tuple[tuple[str, str], ...]) -> sshresolve.Resolved:
    named = sshconfig.chosen_path(_SSH_CONFIG_PATH)
    argv = sshresolve.ssh_g_argv(
        binary, word, os.path.expanduser(named) if named else _home_config(), options
    )
    fix = "fix ssh_config, or name another file with -S"
    try:
        with _SSH_G_SLOTS:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=SSH_G_TIMEOUT,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise TransportError(
            "refused",
            f"{word}: `ssh -G` did not answer within {SSH_G_TIMEOUT:g}s (a `Match "
            f"exec` command that hangs?); {fix}",
        ) from None
    except OSError as exc:
        raise TransportError(
            "refused", f"{word}: cannot run {binary} -G: {exc.strerror or exc}"
        ) from None
    said = done.stderr.decode("utf-8", "replace").strip().splitlines()
    if done.returncode != 0:
        # ssh names the file and line first, then "terminating": both, at most three lines of it
        why = " / ".join(said[:3]) if said else f"exit status {done.returncode}"
        raise TransportError("refused", f"{word}: ssh rejects its ssh_config: {why}; {fix}")
    try:
        return sshresolve.parse(done.stdout.decode("utf-8", "replace"), word)
    except sshresolve.ResolveError as exc:
        raise TransportError("refused", f"{word}: {exc}; {fix}") from None


def config_file() -> str | None:
    """The ssh_config file `ssh` is to read (its -F), or None for ssh's own defaults: the one named
    for this run (fab -S, $FLEETOPS_SSH_CONFIG), else where $HOME is not the password database's
    home, a file that includes $HOME's (_home_config)."""
    named = sshconfig.chosen_path(_SSH_CONFIG_PATH)
    return os.path.expanduser(named) if named else _home_config()


_SHARED_CLASS: Any = None


def _shared_config(**kwargs: Any) -> Config:
    """A _SharedConfig (its class made on first use: it subclasses Fabric's Config)."""
    global _SHARED_CLASS
    if _SHARED_CLASS is None:
        _SHARED_CLASS = _shared_config_class()
    return _SHARED_CLASS(**kwargs)


def _shared_config_class() -> type:
    from fabric import Config

    from .. import compat

    class _SharedConfig(compat.RefuseWrites, Config):
        """The process's one Fabric Config, shared read-only by every connection. Cloning it per
        connection cost ~0.4 ms of client CPU per host; sharing is safe only while nothing writes
        it, because a write re-merges the whole config and a connection reading during that merge
        sees no keys at all ("No attribute ... 'authentication'", seen once in 1920 runs when
        Fabric's `inline_ssh_env` still wrote it). So a write is refused loudly instead of racing
        (compat.RefuseWrites)."""

        def clone(self, into: type[Config] | None = None) -> Config:
            # Fabric clones it for each ProxyJump hop it builds from ssh_config; that copy is the
            # hop's own and Fabric writes to it, so it is a plain Config.
            return super().clone(into=into or Config)

    return _SharedConfig


def fabric_config() -> Config:
    """The process's one Fabric Config, made when a paramiko connection first needs it. Empty:
    every host's settings come from resolve(), never from a second reading by Fabric."""
    global _CONFIG
    _read_files()
    with _LOCK:
        if _CONFIG is None:
            import paramiko

            _CONFIG = _shared_config(ssh_config=paramiko.SSHConfig())
        return _CONFIG


def plain_keys() -> tuple[str, ...]:
    """The keys `fab -i` named, offered to hosts outside the inventory."""
    return _PLAIN_KEYS


def use_key_passphrases(typed: dict[str, str]) -> None:
    """The passphrases typed at --prompt-for-passphrase, one per encrypted key file
    (keys_to_ask)."""
    with _LOCK:
        _KEY_PASSPHRASES.clear()
        _KEY_PASSPHRASES.update({_real(path): value for path, value in typed.items()})


def typed_passphrase(path: str) -> str | None:
    """The passphrase typed for this key file, if it is encrypted and one was: never one for a key
    that is not encrypted (paramiko would refuse the key)."""
    real = _real(path)
    with _LOCK:
        if real in _KEY_PASSPHRASES:
            return _KEY_PASSPHRASES[real]
        shared = _TYPED_PASSPHRASE
    return shared if shared and encrypted(real) else None


def encrypted(path: str) -> bool:
    """Whether the private key file needs a passphrase to open, read from the file itself
    (keyfile.py: no decryption, no paramiko); False when it is missing or no key (said where it is
    used)."""
    return keyfile.encrypted(_real(path)) is True


def any_typed() -> bool:
    """Whether a passphrase was typed for this run (--prompt-for-passphrase)."""
    with _LOCK:
        return bool(_KEY_PASSPHRASES or _TYPED_PASSPHRASE)


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))
