"""What one run holds while it works: the inventory, the playbooks, one connection per host, the
results so far. Made by run.assemble(); handed to every task; never a module global."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import audit
from .plans.inventory import Host, Inventory, load_inventory
from .plans.playbook import Playbook, load_playbook
from .plans.playbookset import PlaybookSet, load_set
from .plans.yamlsrc import ConfigError
from .report.console import Reporter
from .results import Result
from .results.events import Event, Said
from .wire import parked
from .wire.connector import Connector, Pool

DEFAULT_PLAYBOOK = "playbooks/speculators-0.3.0-vllm-0.16.yaml"


class RunState:
    def __init__(
        self,
        root: Path,
        settings: dict[str, Any] | None = None,
        connector: Callable[[Host, Inventory | None], Connector] | None = None,
    ) -> None:
        self.root = root
        self.settings = settings or {}
        # None: SSH, the transport each host's settings choose (wire/transports.py)
        self.connector = connector
        self.transport: str | None = None  # --transport: every host of the run through this one
        self._inventory: Inventory | None = None
        self.pool: Pool | None = None
        self.reporter = Reporter(json_mode=bool(os.environ.get("FLEETOPS_JSON")))
        self.results: list[Result] = []
        self.playbooks: dict[Path, Playbook] = {}
        self.playbook_sets: dict[Path, PlaybookSet] = {}
        self.lock = threading.Lock()
        self.interrupted = threading.Event()  # Ctrl-C: long tasks (tail, --wait) detach and return
        # the hosts this run selected (run.assemble): fleet-wide tasks read it
        self.selected: list[str] = []
        # host -> the job extract launched there in this run: the run's own `tail` shows it from its
        # first line
        self.launched: dict[str, str] = {}
        # host -> the job extract found already running there: the run's `tail` attaches to it (its
        # last lines)
        self.attach: dict[str, str] = {}
        self.audit_errors: list[str] = []  # one per result whose audit line could not be written
        # What every host's steps of this run share, by key: one shard plan per job, whichever task
        # (extract, status, tail) reads or saves it
        self.shared: dict[tuple[str, str], Any] = {}

    def job_launched(self, host: str, job_id: str, where: str) -> None:
        """extract launched `job_id` on `host`: this run's `tail` shows it from its first line, and
        the operator learns its id now, not when the run ends."""
        with self.lock:
            self.launched[host] = job_id
        self.reporter.job_started(host, "extract", job_id, where)

    def emit(self, event: Event) -> None:
        """A task's progress, as a value: report/ says it (the tasks never touch the reporter)."""
        self.reporter.emit(event)

    def audit_error(self, text: str) -> None:
        """An audit line that could not be written: kept for the run's exit status and said now."""
        with self.lock:
            self.audit_errors.append(text)
        self.reporter.error(text)

    def say(self, text: str) -> None:
        """A sentence made outside the job tasks (a lost connection's retry, tasks/reconnect.py)."""
        self.emit(Said(text))

    def transfer(self, label: str, total: int, already: int) -> Any:
        """A file copy's progress, drawn by report/ (one board per console: parallel hosts share
        it); the task calls it with the bytes done so far, then .finish()."""
        from .report.oncall import board_for

        return board_for(self.reporter.console, self.reporter.json_mode).start(
            label, total, already
        )

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.root / self.settings.get("inventory", "hosts"))
        return self._inventory

    def use_ssh_config(
        self,
        path: str | None,
        identity_files: list[str] | tuple[str, ...] = (),
        passphrase: str | None = None,
    ) -> None:
        """Fabric's -S file (else $FLEETOPS_SSH_CONFIG, else the files ssh reads), -i keys and the
        passphrase typed at --prompt-for-passphrase: the file's Host names become -H words for this
        run. Raises ConfigError when the file is missing or unparsable."""
        from .wire.fabconfig import fallback_warning, use_ssh_config
        from .wire.transports import any_paramiko

        self.inventory.ssh_aliases = use_ssh_config(
            path,
            identity_files,
            passphrase,
            any_paramiko(self.inventory.hosts.values(), self.transport),
        )
        if fallback_warning():  # no `ssh` binary: what paramiko's reading leaves out, said once
            self.reporter.note(f"warning: {fallback_warning()}")

    def key_passphrases(self, hosts: list[Host], ask: Callable[[str, list[str]], str]) -> None:
        """--prompt-for-passphrase: ask(path, host names) once for each key file of these hosts that
        needs a passphrase (wire/keys.py keys_to_ask), in path order; the others are never asked for
        nor given one."""
        from .wire.fabconfig import use_key_passphrases
        from .wire.transports import any_paramiko

        if any_paramiko(hosts, self.transport):
            from .wire.ssh import keys_to_ask
        else:  # ssh-agent read through `ssh-add -L`: an openssh run loads no paramiko
            from .wire.opensshkeys import keys_to_ask

        use_key_passphrases(
            {path: ask(path, names) for path, names in sorted(keys_to_ask(hosts).items())}
        )

    def connections(self) -> Pool:
        with self.lock:
            if self.pool is None:
                # a transport's modules load only when a host uses it
                from .wire.transports import Factory

                self.pool = Pool(self.inventory, self.connector or Factory(self.transport))
            return self.pool

    def prepare_while_connecting(self) -> None:
        """The main thread's work while the first hosts are in their SSH handshakes (at 50 ms RTT a
        handshake is ~0.25 s of waiting): load what drawing results needs and what the connector
        sends first (the agent bundle), so neither is done later on a host's critical path."""
        self.reporter.prepare()
        prepare = getattr(self.connections().factory, "prepare", None)
        if callable(prepare):
            prepare()

    def playbook_path(self, override: str | None = None) -> Path:
        """What -p (else FLEETOPS_PLAYBOOK, else fabric.yaml's fleetops.playbook) names: a playbook
        file, or a directory of them (a playbook set)."""
        override = override or os.environ.get("FLEETOPS_PLAYBOOK")
        rel = override or self.settings.get("playbook") or DEFAULT_PLAYBOOK
        path = (
            Path(rel)
            if Path(rel).is_absolute()
            else (Path.cwd() / rel if override else self.root / rel)
        )
        if override and not path.exists():
            path = self.root / rel
        return path.resolve()

    def playbook_set(self, override: str | None = None) -> PlaybookSet | None:
        """The playbook set -p or fabric.yaml names (loaded once per run), None when they name one
        playbook."""
        path = self.playbook_path(override)
        if not path.is_dir():
            return None
        with self.lock:
            if path not in self.playbook_sets:
                self.playbook_sets[path] = load_set(path)
            return self.playbook_sets[path]

    def playbook(self, override: str | None = None) -> Playbook:
        path = self.playbook_path(override)
        if path.is_dir():
            files = ", ".join(p.name for p in sorted(path.glob("*.y*ml"))) or "none there"
            raise ConfigError(
                path,
                None,
                f"a playbook set (a directory); this task reads one playbook: name its "
                f"file with -p ({files})",
            )
        with self.lock:
            if path not in self.playbooks:
                self.playbooks[path] = load_playbook(path)
            return self.playbooks[path]

    def host(self, name: str) -> Host:
        return self.inventory.resolve(name)

    def record(self, result: Result) -> None:
        with self.lock:
            self.results.append(result)
        try:
            audit.append(
                audit.entry(
                    result,
                    result.data.get("playbook"),
                    result.data.get("playbook_sha256"),
                    self._audited_host(result.host),
                    self.root,
                ),
                self.root,
            )
        # the run goes on, told once per cause; run.execute makes it its exit status
        except OSError as exc:
            text = (
                f"audit log {audit.log_path(self.root)}: "
                f"{result.host} {result.task} not recorded: {exc}"
            )
            with self.lock:
                seen = any(e.endswith(str(exc)) for e in self.audit_errors)
                self.audit_errors.append(text)
            if not seen:
                self.reporter.error(text)
        self.reporter.result(result)

    def _audited_host(self, name: str) -> Host | None:
        """The Host a result's task ran against, for its audit line: the one its connection was made
        for (user, address and port as used), else the inventory's; None when neither knows it (then
        the line still says what ran, without an address)."""
        node = self.pool.nodes.get(name) if self.pool is not None else None
        host = getattr(node, "host", None)
        if isinstance(host, Host):
            return host
        try:
            return self.inventory.resolve(name)
        except Exception:  # an audit line must not fail the run over a name it cannot place
            return None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close_all()
        parked.discard_all()  # agents started early for hosts this run did not connect to
