"""`ssh -G` answered from a store that survives the run, used only when it is provably what `ssh -G`
would print now; anything else runs `ssh -G`.

An answer is filed under a key made of everything outside the configuration files that `ssh -G`
reads: the exact argv, the ssh binary's identity (real path, device, inode, size, mtime), the uid
with its passwd name and home (ssh's `~`, %d, %u, `Match localuser`), $HOME, $USER, $LOGNAME, the
local host name (%l, %L, and %C in ControlPath) and, when -F names a relative path, the working
directory. It is used only while its proof holds: every configuration file ssh may read for it
(-F's file, or ~/.ssh/config and /etc/ssh/ssh_config, present or absent, and every file an
`Include` names, in any block, as ssh reads the files of an inactive block too), each with its
device, inode, size, mtime and ctime, and the directory each `Include` pattern globs in (a file
added, removed or renamed there changes its mtime and ctime). The Include lines are read here; the
first stored answer of a process is also checked against ssh's own list (`ssh -G -v`, "Reading
configuration data"): a file ssh read that this reading missed stops storing for the process.

Never stored (`ssh -G` runs every time), as the answer can change with no file changing:
- `Match exec`: runs a command; `Match localnetwork`: the machine's interfaces.
- `${VAR}` anywhere: an environment variable (ssh expands them in many keywords).
- `CanonicalizeHostname` other than no (in a file or -o; read from the answer): DNS.
- `KnownHostsCommand`: a command's output decides the host keys.
- `Include` with a `%` token, `~user`, or a glob in a directory part (the proof stats one
  directory per pattern), or nested deeper than ssh's 16 levels; a read file that is not a regular
  file (a FIFO or device answers differently each time); an `-o Include`; an option word this
  module does not know how to read.
- A file or directory of the proof changed in the last RACY_NS before `ssh -G` ran: a second change
  within one tick of the file system's clock would keep its size and times, so such an answer is
  not yet provable (a later run stores it).
- `ssh -G` failing (its complaint is read when it connects).

The store is one file per key (named PREFIX + key) in the control directory (controldir.py),
written through the directory's descriptor (O_EXCL temporary, O_NOFOLLOW, 0600, renamed into place)
and read only when it is a regular file of ours, mode 0600; at most MAX_ENTRIES (the oldest go). A
damaged entry is a miss. FLEETOPS_SSH_G_CACHE=0 turns the store off."""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import pwd
import re
import shlex
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import controldir

CACHE_ENV = "FLEETOPS_SSH_G_CACHE"
# an entry's name: the prefix and its key (the control directory's other files are sockets and
# their .json records)
PREFIX = "sshg-"
MAX_ENTRIES = 4096
MAX_ENTRY_BYTES = 256 * 1024
RACY_NS = 1_000_000_000
MAX_INCLUDE_DEPTH = 16
FORMAT = 1
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
SSH_G_TIMEOUT = 10.0
# ssh's options that take a value (ssh(1)'s getopt string)
VALUE_OPTIONS = frozenset("bceilmopBDEFIJLOQRSwW")
_READING = re.compile(r"^debug1: Reading configuration data (.+?)\r?$", re.MULTILINE)

StatTuple = list[int] | None


class Uncacheable(Exception):
    """This answer may change with no file changing (the message says why)."""


@dataclass
class Proof:
    """What must be unchanged for a stored answer to hold: files (path, its stat or None when
    absent) and Include directories (the same)."""

    files: dict[str, StatTuple] = field(default_factory=dict)
    dirs: dict[str, StatTuple] = field(default_factory=dict)


def enabled() -> bool:
    return os.environ.get(CACHE_ENV, "1") != "0"


def _file_stat(path: str) -> StatTuple:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode]


def _dir_stat(path: str) -> StatTuple:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_mode]


@functools.lru_cache(maxsize=1)
def _passwd() -> tuple[str, str]:
    try:
        entry = pwd.getpwuid(os.getuid())
    except KeyError:
        return "", ""
    return entry.pw_name, entry.pw_dir


@dataclass(frozen=True)
class Words:
    """An `ssh -G` argv read for what decides its files: -F's value (the last), the -o values."""

    config: str | None
    options: tuple[str, ...]


def read_argv(argv: list[str]) -> Words:
    """Raises Uncacheable for an option word not read here (a joined `-oX`, an unknown form)."""
    config: str | None = None
    options: list[str] = []
    i = 1
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        if len(word) == 2 and word[0] == "-" and word[1] in VALUE_OPTIONS:
            if i + 1 >= len(argv):
                raise Uncacheable(f"{word} without a value")
            if word == "-F":
                config = argv[i + 1]
            elif word == "-o":
                options.append(argv[i + 1])
            i += 2
            continue
        if not word.startswith("-") or (len(word) > 2 and word[1] in VALUE_OPTIONS):
            raise Uncacheable(f"option word {word!r} not read here")
        i += 1
    return Words(config, tuple(options))


def key_of(argv: list[str], words: Words) -> str:
    binary = os.path.realpath(argv[0])
    st = os.stat(binary)
    name, home = _passwd()
    parts = [
        str(FORMAT),
        "\0".join(argv),
        binary,
        f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}",
        str(os.getuid()),
        name,
        home,
        *(f"{v}={os.environ.get(v, '')}" for v in ("HOME", "USER", "LOGNAME")),
        socket.gethostname(),
    ]
    if words.config is not None and not os.path.isabs(words.config):
        parts.append(os.getcwd())
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()


def _check_line(line: str) -> list[str] | None:
    """A config line's Include patterns ([] when it is no Include); raises Uncacheable for a line
    whose effect can change with no file changing."""
    text = line.strip()
    if not text or text.startswith("#"):
        return []
    if "${" in text:
        raise Uncacheable("a ${} expansion")
    keyword, rest = _split_keyword(text)
    # any Match naming them, even inside a pattern: a word too many only costs a `ssh -G`
    if keyword == "match" and ("exec" in rest.lower() or "localnetwork" in rest.lower()):
        raise Uncacheable("Match exec or localnetwork")
    if keyword == "knownhostscommand":
        raise Uncacheable("KnownHostsCommand")
    if keyword == "canonicalizehostname" and rest.strip().strip('"').lower() != "no":
        raise Uncacheable("CanonicalizeHostname")
    if keyword != "include":
        return []
    try:
        return shlex.split(rest)
    except ValueError:
        raise Uncacheable("an Include line not read here") from None


def _split_keyword(text: str) -> tuple[str, str]:
    """A line's keyword (lowercase, ssh takes it quoted too) and the rest."""
    match = re.match(r'(?:"([^"]*)"|([^\s="]+))\s*(?:=\s*)?(.*)$', text)
    if match is None:
        return "", ""
    return (match.group(1) or match.group(2) or "").lower(), match.group(3)


def _pattern_path(pattern: str, system: bool) -> str:
    if "%" in pattern:
        raise Uncacheable("an Include with a % token")
    if pattern.startswith("~"):
        if not pattern.startswith("~/"):
            raise Uncacheable("an Include of ~user")
        return _passwd()[1] + pattern[1:]
    if os.path.isabs(pattern):
        return pattern
    base = "/etc/ssh" if system else os.path.join(_passwd()[1], ".ssh")
    return os.path.join(base, pattern)


def _walk(path: str, system: bool, proof: Proof, depth: int) -> None:
    """Add the file and, through its Include lines, every file and directory it may read."""
    if depth > MAX_INCLUDE_DEPTH:
        raise Uncacheable("Include nested too deep")
    found = _file_stat(path)
    proof.files[path] = found
    if found is None:
        return
    if not stat.S_ISREG(found[5]):
        raise Uncacheable(f"{path} is not a regular file")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        raise Uncacheable(f"{path}: {exc}") from None
    for line in text.splitlines():
        for pattern in _check_line(line) or []:
            full = _pattern_path(pattern, system)
            directory = os.path.dirname(full)
            if glob.has_magic(directory):
                raise Uncacheable("an Include with a glob in a directory part")
            proof.dirs[directory] = _dir_stat(directory)
            for included in sorted(glob.glob(full)):
                if included not in proof.files:
                    _walk(included, system, proof, depth + 1)


def proof_of(words: Words) -> Proof:
    """The files and directories `ssh -G` may read for this argv, with their stats now."""
    for option in words.options:
        _check_line(option)
        if _split_keyword(option)[0] == "include":
            raise Uncacheable("an -o Include")
    proof = Proof()
    if words.config is not None:
        if words.config != "none":
            _walk(words.config, False, proof, 0)
    else:
        _walk(os.path.join(_passwd()[1], ".ssh", "config"), False, proof, 0)
    if words.config is None:
        _walk(SYSTEM_CONFIG, True, proof, 0)
    return proof


def holds(proof: Proof) -> bool:
    return all(_file_stat(p) == s for p, s in proof.files.items()) and all(
        _dir_stat(p) == s for p, s in proof.dirs.items()
    )


def _racy(proof: Proof, started_ns: int) -> bool:
    """Whether a file or directory changed so close to `ssh -G`'s start that a later change could
    leave its stat the same (one tick of the file system's clock)."""
    edge = started_ns - RACY_NS
    for st in proof.files.values():
        if st is not None and (st[3] >= edge or st[4] >= edge):
            return True
    return any(st is not None and (st[2] >= edge or st[3] >= edge) for st in proof.dirs.values())


def _answer_refused(out: bytes) -> bool:
    for line in out.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "canonicalizehostname" and value != "false":
            return True
        if key == "knownhostscommand" and value not in ("", "none"):
            return True
    return False


# -- the store


def store_dir(create: bool = True) -> str | None:
    """The store's directory: the control directory (0700, ours, checked by controldir); None when
    there is no safe one."""
    try:
        return controldir.control_dir(create)
    except (controldir.ControlDirError, OSError):
        return None


def read_entry(directory: str, key: str) -> dict | None:
    """The entry filed under `key`; None when missing, not a regular 0600 file of ours, too big or
    damaged."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(PREFIX + key, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) != 0o600
            or st.st_size > MAX_ENTRY_BYTES
        ):
            return None
        raw = os.read(fd, MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _parse_entry(raw, key)


def _parse_entry(raw: bytes, key: str) -> dict | None:
    try:
        data = json.loads(raw)
        if not (
            isinstance(data, dict)
            and data.get("format") == FORMAT
            and data.get("key") == key
            and isinstance(data.get("out"), str)
            and isinstance(data.get("files"), dict)
            and isinstance(data.get("dirs"), dict)
        ):
            return None
    except ValueError:
        return None
    return data


def write_entry(directory: str, key: str, proof: Proof, out: bytes) -> None:
    data = json.dumps(
        {
            "format": FORMAT,
            "key": key,
            "files": proof.files,
            "dirs": proof.dirs,
            "out": out.decode("utf-8", "surrogateescape"),
        }
    ).encode("utf-8", "surrogateescape")
    if len(data) > MAX_ENTRY_BYTES:
        return
    controldir.write_private(directory, PREFIX + key, data)
    _bound(directory)


# entries in the store as this process last counted them, plus those it wrote since (an
# overestimate: a rewrite replaces an entry), so a run of misses lists the directory only when the
# cap may have been reached
_counted: dict[str, int] = {}


def _bound(directory: str) -> None:
    """At most MAX_ENTRIES entries: past it, the oldest go down to three quarters."""
    if directory in _counted:
        _counted[directory] += 1
        if _counted[directory] <= MAX_ENTRIES:
            return
    try:
        with os.scandir(directory) as it:
            names = [e.name for e in it if e.name.lstrip(".").startswith(PREFIX)]
    except OSError:
        return
    _counted[directory] = len(names)
    if len(names) <= MAX_ENTRIES:
        return
    aged = []
    for name in names:
        with contextlib.suppress(OSError):
            aged.append((os.lstat(os.path.join(directory, name)).st_mtime_ns, name))
    aged.sort()
    for _, name in aged[: len(aged) - MAX_ENTRIES * 3 // 4]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
    _counted[directory] = MAX_ENTRIES * 3 // 4


# -- the lookup

# top-level files whose reading was checked against `ssh -G -v` in this process: True agreed
_checked: dict[tuple[str, ...], bool] = {}


def _ssh_read(argv: list[str]) -> set[str] | None:
    """The files `ssh -G -v` says it read, None when it cannot say."""
    try:
        done = subprocess.run(
            [*argv[:-2], "-v", *argv[-2:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SSH_G_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return set(_READING.findall(done.stderr.decode("utf-8", "replace")))


def _agrees(argv: list[str], proof: Proof) -> bool:
    """Whether every file ssh reads for this argv is in the proof (once per process and set of
    files)."""
    ident = tuple(sorted(proof.files))
    if ident not in _checked:
        read = _ssh_read(argv)
        known = {(s[0], s[1]) for s in proof.files.values() if s is not None}
        _checked[ident] = read is not None and all(
            (s := _file_stat(p)) is not None and (s[0], s[1]) in known for p in read
        )
    return _checked[ident]


def lookup(argv: list[str], run: Callable[[list[str]], bytes | None]) -> bytes | None:
    """`ssh -G`'s output for argv (`ssh ... -G ... -- word`): the stored answer when its proof
    holds, else run(argv)'s (None: ssh failed), stored when provable."""
    if not enabled():
        return run(argv)
    try:
        words = read_argv(argv)
        key = key_of(argv, words)
    except (Uncacheable, OSError):
        return run(argv)
    directory = store_dir()
    if directory is None:
        return run(argv)
    entry = read_entry(directory, key)
    if entry is not None:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            if holds(Proof(entry["files"], entry["dirs"])):
                return str(entry["out"]).encode("utf-8", "surrogateescape")
    started = time.time_ns()
    out = run(argv)
    if out is None or _answer_refused(out):
        return out
    try:
        proof = proof_of(words)
    except (Uncacheable, OSError):
        return out
    if _racy(proof, started) or not _agrees(argv, proof):
        return out
    with contextlib.suppress(OSError):
        write_entry(directory, key, proof, out)
    return out
