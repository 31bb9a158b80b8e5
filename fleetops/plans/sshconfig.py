"""Which OpenSSH client configuration a run reads, as text with every `Include` spliced in.

A host's settings come from `ssh -G` (plans/sshresolve.py, wire/fabconfig.py); this text serves what
ssh does not print: the names a run may use as -H words (`host_aliases`), and paramiko's reading
when there is no `ssh` binary (paramiko does not follow `Include`). So the files are chosen as `ssh`
chooses them (a `-S`/`-F` file alone, else ~/.ssh/config then /etc/ssh/ssh_config) and Includes
inlined (globs, `~`, paths relative to ~/.ssh or /etc/ssh, at most 16 deep)."""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from .yamlsrc import ConfigError

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_KEYWORD = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")


def user_config() -> Path:
    return Path(os.path.expanduser("~/.ssh/config"))


def chosen_path(path: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The ssh_config file named for this run (fab -S, or $FLEETOPS_SSH_CONFIG), or None for the
    defaults."""
    env = os.environ if environ is None else environ
    return path or env.get("FLEETOPS_SSH_CONFIG") or None


def config_text(
    path: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """(the configuration as one text, the files it came from). A named file is read alone, as `ssh
    -F` does; a named file that does not exist is an error (a typo must not silently mean "no
    config")."""
    named = chosen_path(path, environ)
    files: list[str] = []
    if named:
        file = Path(named).expanduser()
        if not file.is_file():
            raise ConfigError(
                named, None, "ssh_config file not found (given with -S or FLEETOPS_SSH_CONFIG)"
            )
        return _expand(file, user=True, depth=0, files=files), files
    parts = [
        _expand(p, user=(p != SYSTEM_CONFIG), depth=0, files=files)
        for p in (user_config(), SYSTEM_CONFIG)
        if p.is_file()
    ]
    return "\n".join(parts), files


def _expand(path: Path, *, user: bool, depth: int, files: list[str]) -> str:
    if depth > MAX_INCLUDE_DEPTH:
        raise ConfigError(
            path, None, f"ssh_config Include nested deeper than {MAX_INCLUDE_DEPTH} (a loop?)"
        )
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read ssh_config: {exc.strerror or exc}") from None
    files.append(str(path))
    out: list[str] = []
    # the Host/Match line in force: restored after an included file, whose own blocks end there
    block = ""
    for number, line in enumerate(text.splitlines(), 1):
        match = _KEYWORD.match(line)
        keyword = match.group(1).lower() if match and not line.lstrip().startswith("#") else ""
        if keyword in ("host", "match"):
            block = line.strip()
        if match is None or keyword != "include":
            out.append(line)
            continue
        try:
            patterns = shlex.split(match.group(2))
        except ValueError as exc:
            raise ConfigError(path, number, f"bad Include line: {exc}") from None
        for included in _included(patterns, user):
            out.append(_expand(included, user=user, depth=depth + 1, files=files))
        if block:
            out.append(block)
    return "\n".join(out)


def _included(patterns: list[str], user: bool) -> list[Path]:
    """The files an Include line's patterns match, in order; a relative pattern is taken from
    ~/.ssh in the user's configuration, from /etc/ssh in the system's. A pattern matching nothing
    is fine, as in ssh."""
    base = Path(os.path.expanduser("~/.ssh")) if user else SYSTEM_CONFIG.parent
    files: list[Path] = []
    for pattern in patterns:
        full = os.path.expanduser(pattern)
        full = full if os.path.isabs(full) else str(base / full)
        files += [Path(included) for included in sorted(glob.glob(full))]
    return files


def host_aliases(text: str) -> set[str]:
    """Names the configuration defines explicitly: `Host` patterns and `Match host`/`originalhost`
    values without wildcards or negation. Only these may be -H words that are neither inventory
    names nor addresses, so a typo is an error and never a DNS lookup."""
    names: set[str] = set()
    for line in text.splitlines():
        match = _KEYWORD.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        keyword, value = match.group(1).lower(), match.group(2)
        words: list[str] = []
        if keyword == "host":
            words = value.split()
        elif keyword == "match":
            tokens = value.split()
            for criterion, arg in zip(tokens, tokens[1:], strict=False):
                if criterion.lower() in ("host", "originalhost"):
                    words += arg.split(",")
        names.update(w for w in words if w and not any(c in w for c in "*?!"))
    return names
