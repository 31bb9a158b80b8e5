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

Anything this cannot read as the run will (an option it does not know, `--`, a Fabric config file
beyond the project's, FABRIC_*/INVOKE_* variables, FLEETOPS_LIMIT, `become`, more than MAX_HOSTS
hosts, a host on paramiko or without a live master) starts nothing: the run starts its agents
itself, as it always did. An error here is never shown: the run meets the same error and reports
it. FLEETOPS_EARLY_AGENTS=0 turns this off."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import parked

HOST_FLAGS = ("-H", "--hosts")
# Task options that change nothing about which hosts are reached, how, or as whom: name -> takes a
# value. Any other option, core or task, leaves the start to the run.
HARMLESS: dict[str, bool] = {
    "--kinds": True,
    "-j": False,
    "--json": False,
    "--verbose": False,
    "--no-fold": False,
    "--odd": False,
    "-c": False,
    "--check": False,
    "--diff": False,
}
# Host tasks: each one's first act on a node is a request to its agent.
TASKS = frozenset({"ping", "facts", "patch", "verify", "rollback", "gpu", "status", "diagnose"})
MAX_HOSTS = 64
OFF_ENV = "FLEETOPS_EARLY_AGENTS"
# Fabric's and Invoke's config files beyond the project's own: any of them may set what this reads
# without them (Fabric's connect_kwargs, a user, a key).
OTHER_CONFIGS = tuple(
    os.path.join(folder, name + ext)
    for folder, name in (("~", ".fabric"), ("/etc", "fabric"))
    for ext in (".yaml", ".yml", ".json", ".py")
)
# fabric.yaml's top-level keys that say nothing about hosts or logins
PROJECT_KEYS = frozenset({"fleetops", "tasks"})


def hosts_word(argv: Sequence[str]) -> str | None:
    """-H's value when the command line is `-H HOSTS` followed by host tasks and HARMLESS options
    only; None for any other."""
    word: str | None = None
    tasks = 0
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in HOST_FLAGS or token.startswith("--hosts="):
            if word is not None or tasks:  # -H twice, or after a task (a task's own option)
                return None
            word, i = _host_value(argv, i)
            if word is None:
                return None
        elif token.startswith("-"):
            width = _option_width(token)
            if width is None:
                return None
            i += width - 1
        elif token in TASKS and word is not None:
            tasks += 1
        else:
            return None
        i += 1
    return word if tasks and word else None


def _host_value(argv: Sequence[str], i: int) -> tuple[str | None, int]:
    """The value of the -H at argv[i], and the index of the last word it took."""
    if "=" in argv[i]:
        return argv[i].partition("=")[2], i
    if i + 1 < len(argv):
        return argv[i + 1], i + 1
    return None, i


def _option_width(token: str) -> int | None:
    """How many words a HARMLESS option takes up (its value included); None for any other."""
    name, eq, _ = token.partition("=")
    if name not in HARMLESS:
        return None
    return 2 if HARMLESS[name] and not eq else 1


def begin(argv: Sequence[str], environ: dict[str, str] | None = None) -> list[str]:
    """Start the agents this command line's run will use, where it can (the module's docstring);
    the hosts whose agent was started."""
    env = os.environ if environ is None else environ
    if env.get(OFF_ENV) == "0" or _environment_says_more(env):
        return []
    word = hosts_word(argv)
    if word is None:
        return []
    try:
        return _start(word)
    except Exception:  # the run meets the same and reports it; nothing started here is kept
        parked.discard_all()
        return []


def _environment_says_more(env: dict[str, str] | os._Environ[str]) -> bool:
    return bool(env.get("FLEETOPS_LIMIT")) or any(
        name.startswith(("FABRIC_", "INVOKE_")) for name in env
    )


def _start(word: str) -> list[str]:
    from ..plans.hostrange import split_words
    from ..plans.inventory import find_inventory, load_inventory
    from ..plans.projectfile import find_project
    from .fabconfig import use_ssh_config
    from .transports import chosen

    root = find_project(Path.cwd())
    settings = _settings(root) if root is not None else None
    if root is None or settings is None:
        return []
    words = split_words(word)
    if any(w.startswith("@failed") for w in words):
        return []
    inventory = load_inventory(find_inventory(root, None, str(settings.get("inventory", "hosts"))))
    inventory.ssh_aliases = use_ssh_config(None, [], None, paramiko_reads=False)
    hosts = inventory.targets(inventory.expand(words))
    if len(hosts) > MAX_HOSTS:
        return []
    wanted = [h for h in hosts if not h.become and chosen(h) == "openssh"]
    if not wanted:
        return []
    from .openssh import OpenSSHConnection
    from .sshcmd import stored_answers_only

    started = []
    # a host whose `ssh -G` is not in the store is left to the run, which resolves its hosts in
    # parallel: one `ssh -G` process after another here would hold up a cold run's start
    with stored_answers_only():
        for host in wanted:
            connection = OpenSSHConnection(host, inventory)
            if connection.start_on_live_master():
                parked.park(host, connection)
                started.append(host.name)
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
    section = data.get("fleetops") or {}
    return dict(section) if isinstance(section, dict) else None
