"""The agents of a warm OpenSSH run, started before the program's own start-up.

A host whose master is up costs a run three round trips on the wire: the session's channel, the
agent's command (sshd opens the channel's window only once that command runs), then the requests and
their answers. `fleet` spends longer than two of them importing Invoke and its tasks, building the
task table and planning the run before it sends anything. So for a command line simple enough to
read without the program (`fleet -H HOSTS TASK ... [harmless options]`), entry.py has each host's
agent started first, through the same connection code the run uses, on the live master only: no
login, no new connection, no request. The run's Pool then takes each one over only when it is the
connection the run would have made itself (transports.Factory: the same Host, ssh command line,
`ssh -G` settings and agent command); any other is closed and the run connects as it would have.

Anything this cannot read as the run will (an option it does not know or that its task does not
take, `--`, a Fabric config file beyond the project's, FABRIC_*/INVOKE_* variables, FLEETOPS_LIMIT,
FLEETOPS_SERIAL, `become`, more hosts than MAX_HOSTS or the run's forks, a host on paramiko or
without a live master) starts nothing: the run starts its agents itself, as it always did. An error
here is never shown: the run meets the same error and reports it; a host that fails here leaves the
others' agents started. FLEETOPS_EARLY_AGENTS=0 (or no, off, false) turns this off."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..plans.options import OFF_WORDS
from . import parked

if TYPE_CHECKING:
    from ..plans.host import Host
    from ..plans.inventory import Inventory

HOST_FLAGS = ("-H", "--hosts")
# Options that change nothing about which hosts are reached, how, or as whom: name -> takes a value.
# The run options here every host task takes, and `fleet` before its task too.
ANYWHERE: dict[str, bool] = {
    "-j": False,
    "--json": False,
    "--verbose": False,
    "--no-fold": False,
    "--odd": False,
}
# The same of one task's own options: name -> (takes a value, the tasks that take it). Given after
# another task, or before any, the program refuses it (exit 2): nothing is started for it.
TASK_OPTIONS: dict[str, tuple[bool, frozenset[str]]] = {
    "--kinds": (True, frozenset({"verify"})),
    "-c": (False, frozenset({"patch", "rollback"})),
    "--check": (False, frozenset({"patch", "rollback"})),
    "--diff": (False, frozenset({"patch", "rollback"})),
}
# Host tasks: each one's first act on a node is a request to its agent.
TASKS = frozenset({"ping", "facts", "patch", "verify", "rollback", "gpu", "status", "diagnose"})
MAX_HOSTS = 64
OFF_ENV = "FLEETOPS_EARLY_AGENTS"
# Starting a host's agent early takes well under a millisecond of this budget: one past it means
# masters that are slow to answer, and the hosts not reached by then are left to the run.
BUDGET_S = 1.0
# Fabric's and Invoke's config files beyond the project's own: any of them may set what this reads
# without them (Fabric's connect_kwargs, a user, a key).
OTHER_CONFIGS = tuple(
    os.path.join(folder, name + ext)
    for folder, name in (("~", ".fabric"), ("/etc", "fabric"))
    for ext in (".yaml", ".yml", ".json", ".py")
)
# fabric.yaml's top-level keys that say nothing about hosts or logins
PROJECT_KEYS = frozenset({"fleetops", "tasks"})
# its `tasks:` as `fleet init` writes it: fleetops' own executor runs the tasks
OWN_TASKS = {"executor_class": "fleetops.fab.executor.FleetExecutor"}


def hosts_word(argv: Sequence[str]) -> str | None:
    """-H's value when the command line is `-H HOSTS` followed by host tasks, each with options of
    its own from TASK_OPTIONS, and ANYWHERE options only; None for any other."""
    word: str | None = None
    task: str | None = None  # the last task named: the options after it are its own
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in HOST_FLAGS or token.startswith("--hosts="):
            if word is not None or task:  # -H twice, or after a task (a task's own option)
                return None
            word, i = _host_value(argv, i)
            if word is None:
                return None
        elif token.startswith("-"):
            width = _option_width(token, task)
            if width is None:
                return None
            i += width - 1
        elif token in TASKS and word is not None:
            task = token
        else:
            return None
        i += 1
    return word if task and word else None


def _host_value(argv: Sequence[str], i: int) -> tuple[str | None, int]:
    """The value of the -H at argv[i], and the index of the last word it took."""
    if "=" in argv[i]:
        return argv[i].partition("=")[2], i
    if i + 1 < len(argv):
        return argv[i + 1], i + 1
    return None, i


def _option_width(token: str, task: str | None) -> int | None:
    """How many words an option after `task` takes up (its value included), when it is one of
    ANYWHERE or one of that task's TASK_OPTIONS; None for any other."""
    name, eq, _ = token.partition("=")
    if name in ANYWHERE:
        takes_value = ANYWHERE[name]
    elif name in TASK_OPTIONS and task in TASK_OPTIONS[name][1]:
        takes_value = TASK_OPTIONS[name][0]
    else:
        return None
    return 2 if takes_value and not eq else 1


def begin(argv: Sequence[str], environ: dict[str, str] | None = None) -> list[str]:
    """Start the agents this command line's run will use, where it can (the module's docstring);
    the hosts whose agent was started."""
    env = os.environ if environ is None else environ
    if env.get(OFF_ENV, "").strip().lower() in OFF_WORDS or _environment_says_more(env):
        return []
    word = hosts_word(argv)
    if word is None:
        return []
    try:
        return _start(word, env)
    except Exception:  # the run meets the same and reports it; nothing started here is kept
        parked.discard_all()
        return []


def _environment_says_more(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the environment names hosts, a login or a roll-out this does not read: a limit, a
    staged roll-out (its later batches may never run), Fabric's or Invoke's settings."""
    return bool(env.get("FLEETOPS_LIMIT") or env.get("FLEETOPS_SERIAL")) or any(
        name.startswith(("FABRIC_", "INVOKE_")) for name in env
    )


def _forks(env: dict[str, str] | os._Environ[str], settings: dict[str, Any]) -> int | None:
    """How many hosts the run works on at once, read as the run reads it (plans/options.py); None
    for a value the run will refuse."""
    from ..plans.options import BadValue, configured_forks

    try:
        return configured_forks(env, settings)
    except BadValue:
        return None


def _start(word: str, env: dict[str, str] | os._Environ[str]) -> list[str]:
    chosen = _hosts(word, env)
    # none on OpenSSH: its modules are not even imported (a paramiko run never loads them)
    return _start_each(*chosen) if chosen is not None and chosen[0] else []


def _hosts(
    word: str, env: dict[str, str] | os._Environ[str]
) -> tuple[list[Host], Inventory] | None:
    """The run's hosts that reach their node through OpenSSH without become, and the inventory, as
    the run will read them; None when the run may read them otherwise or work on them in turns."""
    from ..plans.hostrange import split_words
    from ..plans.inventory import find_inventory, load_inventory
    from ..plans.projectfile import find_project
    from .fabconfig import use_ssh_config
    from .transports import chosen

    root = find_project(Path.cwd())
    settings = _settings(root) if root is not None else None
    if root is None or settings is None:
        return None
    words = split_words(word)
    if any(w.startswith("@failed") for w in words):
        return None
    inventory = load_inventory(find_inventory(root, None, str(settings.get("inventory", "hosts"))))
    inventory.ssh_aliases = use_ssh_config(None, [], None, paramiko_reads=False)
    hosts = inventory.targets(inventory.expand(words))
    forks = _forks(env, settings)
    # hosts beyond the run's forks would wait their turn with an idle agent
    if forks is None or len(hosts) > min(MAX_HOSTS, forks):
        return None
    return [h for h in hosts if not h.become and chosen(h) == "openssh"], inventory


def _start_each(wanted: list[Host], inventory: Inventory) -> list[str]:
    """Each host's agent started on its live master, within the time budget; the hosts started."""
    from .openssh import OpenSSHConnection
    from .sshcmd import stored_answers_only

    started: list[str] = []
    deadline = time.monotonic() + BUDGET_S
    # a host whose `ssh -G` is not in the store is left to the run, which resolves its hosts in
    # parallel: one `ssh -G` process after another here would hold up a cold run's start
    with stored_answers_only():
        for host in wanted:
            if time.monotonic() > deadline:
                break
            connection = None
            try:  # one host's trouble (a key missing, a secret unset) is the run's to report
                connection = OpenSSHConnection(host, inventory)
                if connection.start_on_live_master():
                    parked.park(host, connection)
                    started.append(host.name)
            except Exception:
                if connection is not None:
                    parked.discard(connection)
    return started


def _settings(root: Path) -> dict[str, Any] | None:
    """fabric.yaml's `fleetops:` section, when the project's fabric.yaml is all the Fabric config
    there is and says nothing about hosts or logins; None otherwise."""
    from ..plans.projectfile import PROJECT_FILES
    from ..plans.yamlsrc import load_file

    if any(os.path.exists(os.path.expanduser(p)) for p in OTHER_CONFIGS):
        return None
    present = [root / name for name in (*PROJECT_FILES, "fabric.py") if (root / name).exists()]
    if not present:
        return {}
    if present != [root / "fabric.yaml"]:
        return None
    data = load_file(root / "fabric.yaml")
    if data is None:
        return {}
    if not isinstance(data, dict) or not set(data) <= PROJECT_KEYS:
        return None
    if data.get("tasks") not in (None, {}, OWN_TASKS):  # another executor may pick other hosts
        return None
    section = data.get("fleetops") or {}
    return dict(section) if isinstance(section, dict) else None
