"""The inventory: which files a run reads (`find_inventory`), all of them loaded (`load_inventory`;
one file is plans/inventoryfile.py's), and the selection over its hosts: -H words (`expand`,
`resolve`: names, @groups, globs, ranges, addresses and ssh_config aliases), `--limit`, and example
hosts refused as targets.

Re-exports plans/host.py's Host, CommandLine, UnknownHost, MissingSecret, plain_host and
split_target: the wire, the tasks and the tests name them from here."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import hostrange, sshconfig
from .host import CommandLine, Host, MissingSecret, UnknownHost, plain_host, split_target
from .hostrange import split_words
from .inventoryfile import load_one
from .jumps import jump_named
from .marks import did_you_mean
from .yamlsrc import ConfigError

__all__ = [
    "CommandLine",
    "Host",
    "Inventory",
    "MissingSecret",
    "UnknownHost",
    "find_inventory",
    "load_inventory",
    "plain_host",
    "split_target",
    "ssh_config_aliases",
]


@dataclass
class Inventory:
    hosts: dict[str, Host] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    # Names ssh_config defines (Host and Match host names without wildcards; Include and -S files
    # too). Computed in wire/ssh.py with paramiko's SSHConfig and handed in by the caller; None:
    # read here from the default files (plans/sshconfig.py), on first need.
    ssh_aliases: frozenset[str] | None = None
    # --allow-insecure-venv: a node whose interpreter others may write to runs the agent anyway,
    # with a warning
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

    def listed(self) -> list[str]:
        """The host names an error lists and suggests: this project's own hosts, never an example
        inventory's beside them (documentation, refused as targets); the example's alone while it is
        all there is."""
        own = [n for n in self.names() if not self.hosts[n].example]
        return own or self.names()

    def listed_groups(self) -> dict[str, list[str]]:
        shown = set(self.listed())
        return {g: members for g, members in self.groups().items() if shown & set(members)}

    def aliases(self) -> frozenset[str]:
        if self.ssh_aliases is None:
            self.ssh_aliases = frozenset(ssh_config_aliases())
        return self.ssh_aliases

    def resolve(self, spec: str) -> Host:
        """One -H word → a Host. Inventory names win (with `user@`/`:port` overriding theirs);
        addresses and ssh_config aliases fall through to ssh."""
        spec = spec.strip()
        if spec in self.hosts:
            return self.hosts[spec]
        user, name, port = split_target(spec)
        if name in self.hosts and (user or port):
            host = self.hosts[name]
            return replace(host, user=user or host.user, port=port or host.port)
        if user or port or "." in name or ":" in name or name in self.aliases():
            # a jump host some inventory host names: with the keys it is reached with
            plain = plain_host(spec)
            return jump_named(self.hosts.values(), spec, plain, self.aliases) or plain
        raise UnknownHost(self._unknown(spec))

    def _unknown(self, spec: str) -> str:
        hint = did_you_mean(spec, [*self.listed(), *(f"@{g}" for g in self.listed_groups())])
        known = ", ".join(self.listed()) or "(none: run `fab lab.up` or add hosts/*.yaml)"
        # "did you mean" last: older messages (and scripts) read "unknown host 'x'; known hosts:
        # ..."
        return f"unknown host {spec!r}; known hosts: {known} (looked in: {self._where()}){hint}"

    def _where(self) -> str:
        files = ", ".join(self.files) or "no inventory file"
        return f"{files}; and ssh_config's Host names"

    def _group(self, word: str) -> list[Host]:
        groups = self.groups()
        members = groups.get(word[1:])
        if not members:
            if any(c in word for c in "*?["):  # @gpu* : every group that matches
                members = [
                    m for g in sorted(groups) if fnmatch.fnmatchcase(g, word[1:]) for m in groups[g]
                ]
            if not members:
                shown = self.listed_groups()
                hint = did_you_mean(word, [f"@{g}" for g in shown])
                known = ", ".join(sorted(shown)) or "(none)"
                raise UnknownHost(f"unknown group {word!r}{hint} (known groups: {known})")
        return [self.hosts[m] for m in members]

    def _glob(self, word: str) -> list[Host]:
        hits = [self.hosts[n] for n in self.hosts if fnmatch.fnmatchcase(n, word)]
        if not hits:
            known = ", ".join(self.listed()) or "(none)"
            raise UnknownHost(f"no inventory host matches {word!r} (known hosts: {known})")
        return hits

    def expand(self, words: list[str]) -> list[Host]:
        """-H values → hosts, in the order given, each once. A word is an inventory name, `@group`,
        a glob over inventory names (`lab0*`, `gpu[12]`), `user@name:port` (an inventory name with
        its user or port overridden, or an address/ssh_config alias for ssh itself), or several of
        these separated by commas."""
        out: list[Host] = []
        for word in (w for chunk in words for w in split_words(chunk)):
            if hostrange.is_range(word):  # lab[01-12]: each name as if typed on its own
                out.extend(
                    self.command_line.apply(self.resolve(name), name)
                    for name in hostrange.expand(word)
                )
            elif word.startswith("@"):
                out.extend(self.command_line.apply(h, "") for h in self._group(word))
            elif any(c in word for c in "*?[") and "@" not in word:
                out.extend(self.command_line.apply(h, "") for h in self._glob(word))
            else:
                out.append(self.command_line.apply(self.resolve(word), word))
        unique: dict[str, Host] = {}
        for h in out:
            unique.setdefault(h.name, h)
        return list(unique.values())

    def targets(self, hosts: list[Host]) -> list[Host]:
        """`hosts`, refused (UnknownHost, before anything connects) when one comes from an example
        inventory: documentation, never a target."""
        examples = [h for h in hosts if h.example]
        if examples:
            first = examples[0]
            raise UnknownHost(
                f"{first.name} is an example host ({first.source}, a file marked `example: "
                "true`), not one of yours: copy it into your own hosts/*.yaml without that "
                "line, with your node's address, to use it; this project's other hosts: "
                f"{', '.join(n for n in self.names() if not self.hosts[n].example) or '(none)'}"
            )
        return hosts

    def limit(self, hosts: list[Host], expr: str) -> list[Host]:
        """--limit: the hosts (in their order) that `expr` selects. Terms are separated by commas; a
        term is a name, a glob (`lab0*`), `@group`, or any of those after `!` to exclude. With only
        exclusions, every host is a candidate. Raises UnknownHost for a term that names no inventory
        host or group (with a "did you mean"), and when nothing is left."""
        include, exclude = _limit_terms(expr)
        if not include and not exclude:
            return list(hosts)
        for term in include + exclude:
            self._check_limit_term(term, hosts)
        chosen = [
            h
            for h in hosts
            if (not include or any(self._selects(t, h) for t in include))
            and not any(self._selects(t, h) for t in exclude)
        ]
        if not chosen:
            raise UnknownHost(
                f"--limit {expr!r} matches none of the selected hosts "
                f"({', '.join(h.name for h in hosts) or 'none'})"
            )
        return chosen

    def _selects(self, term: str, host: Host) -> bool:
        """Whether one --limit term (a name, a glob, `@group`) selects `host`."""
        if term.startswith("@"):
            self._group(term)  # unknown group: an error, never a silent no-match
            return any(fnmatch.fnmatchcase(g, term[1:]) for g in host.groups)
        return fnmatch.fnmatchcase(host.name, term) or fnmatch.fnmatchcase(host.address, term)

    def _check_limit_term(self, term: str, hosts: list[Host]) -> None:
        """A plain name that names no host: UnknownHost, with a "did you mean"."""
        if term.startswith("@") or any(c in term for c in "*?["):
            return
        if term in self.hosts or any(term in (h.name, h.address) for h in hosts):
            return
        hint = did_you_mean(term, [*self.listed(), *(f"@{g}" for g in self.listed_groups())])
        raise UnknownHost(
            f"--limit names unknown host {term!r}{hint} (known hosts: "
            f"{', '.join(self.listed()) or '(none)'})"
        )


def _limit_terms(expr: str) -> tuple[list[str], list[str]]:
    """--limit's terms, ranges expanded: those to include, those after `!` to exclude."""
    include: list[str] = []
    exclude: list[str] = []
    for term in split_words(expr):
        bare = term.lstrip("!").strip()
        for name in hostrange.expand(bare) if hostrange.is_range(bare) else [bare]:
            (exclude if term.startswith("!") else include).append(name)
    return include, exclude


def ssh_config_aliases(path: str | None = None) -> set[str]:
    """The alias set when the caller passed none: names from the same files ssh reads (a -S file or
    $FLEETOPS_SSH_CONFIG alone, else ~/.ssh/config and /etc/ssh/ssh_config, Includes followed)."""
    return sshconfig.host_aliases(sshconfig.config_text(path)[0])


def find_inventory(
    root: Path,
    override: str | None = None,
    default: str = "hosts",
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Which inventory a run uses: `override` (-i/--inventory), else $FLEETOPS_INVENTORY, else
    `root/default` (fabric.yaml's fleetops.inventory, `hosts`). A relative override is taken from
    the current directory first (as typed), then from the project root. A directory (every *.yaml in
    it) or one file. Raises ConfigError naming what was tried when it does not exist."""
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
    raise ConfigError(
        chosen,
        None,
        f"inventory named by {where} not found (looked at "
        f"{', '.join(str(t) for t in dict.fromkeys(tried))}); give a hosts "
        "directory or one .yaml file",
    )


def load_inventory(directory: Path, ssh_aliases: frozenset[str] | None = None) -> Inventory:
    """Every *.yaml/*.yml in `directory`, or the one file `directory` names."""
    inv = Inventory(ssh_aliases=ssh_aliases)
    directory = Path(directory)
    files = (
        [directory]
        if directory.is_file()
        else sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    )
    for path in files:
        load_one(path, inv.hosts, inv.files)
    return inv
