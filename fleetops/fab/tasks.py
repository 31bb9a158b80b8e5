"""fleetops' tasks as one Fabric namespace (`ns`), which a project's fabfile.py imports in one line
and `fleet` bundles. Thin: a host task declared in its family's module (fleetops/tasks/declare.py)
becomes its fab task here; the local tasks (history, ssh-config, lint, runbooks) are defined below.
The executor (fleetops/fab/executor.py) runs fleetops.tasks' task of that name on every host.

    fab lab.up                     # a local lab node: sshd, vllm 0.16.0 + speculators 0.3.0
    fab -H lab01 patch verify      # patch the node's speculators, then prove it works
    fab -H lab01 patch --check     # show the diff, change nothing
    fab -H lab01 rollback
    fab -H @lab run "nvidia-smi --query-gpu=memory.used --format=csv"   # an ad-hoc command
    fleet -H lab01,lab02 -- uname -a     # Fabric's ad-hoc form, through the inventory: `fleet`
                                         # only (Fabric's own `fab` reads no project for a
                                         # command without a task)

Flags (one scheme for every task; fleetops/fab/decorators.py SHORT_FLAGS):
    -j  --json       one JSON document instead of the human view (every task, history too)
    -c  --check      patch/rollback: show what would change, write nothing
    -p  --playbook   the playbook YAML
    -u  --user       the login user for every host of the run
    Every other option is long only (--job-id, --job, --diff, --kinds, --host, --last, ...); -h is
    --help.
    Run options, on any host task: --serial N, --forks N, --limit EXPR (names, globs, @group,
    !host), --inventory PATH (or FLEETOPS_INVENTORY), -u USER, --port N, --no-fold, --odd; before or
    after the task (`fleet` has them as core flags too; Fabric's own `fab` takes them after the
    task). Whole-number options are declared with their ranges (numbers=) and checked before
    anything connects (fab/flags.py).
    Fabric's own -i is the SSH identity file, so the inventory is --inventory only. -i, -u, --port
    and -t win over the inventory, as ssh's do; -T is the ad-hoc command's timeout.
    --dry (Fabric's core -R/--dry): check mode for patch/rollback; read-only tasks run as they are;
    a task that changes things and has no check mode (run, extract, stop, trust) is refused with
    exit 2.
    Fabric's -w, -e, --hide, --pty and password prompts do nothing here: refused, with the reason.
Exit statuses: 0 ok, 1 failed, 2 usage error (no request sent), 4 unreachable, 10-13 GPU gate,
20-22 diagnose, 130 Ctrl-C, 141 stdout closed by its reader.
"""

import sys

from invoke import Collection
from invoke.exceptions import Exit

from ..tasks.declare import HELP_JSON, HELP_PLAYBOOK
from ..tasks.registry import declared_tasks
from . import usage as _usage
from .decorators import explicit_task, from_declaration
from .loading import wants_lab

# The local tasks' report modules are imported in their bodies, and the lab.* collection only for a
# command line that may name it (fleetops/fab/loading.py): a host task's start-up loads neither.


# `fab` reaches fleetops' code first here, while Invoke imports the fabfile (the module being
# imported)
_usage.at_fabfile_load(getattr(sys.modules.get("fabfile"), "__file__", None))


@explicit_task(
    numbers={"last": (0, None)},
    help={
        "host": "only this host (inventory name)",
        "last": "only the last N entries (default 50)",
        "json": HELP_JSON,
    },
)
def history(c, host=None, last=50, json=False):
    """This project's audit log: every task run, who ran it, on which host (address, inventory
    file), with what result and exit status. One log per project, outside the checkout (its path is
    the table's title); FLEETOPS_AUDIT_LOG=FILE uses FILE instead."""
    from ..report.history import show_history

    show_history(
        host=host,
        last=int(last) if last else None,
        as_json=json,
        root=(c.config.get("fleetops") or {}).get("root"),
    )


@explicit_task(
    help={
        "host": "only these hosts: names, globs, @group, comma-separated (default: all)",
        "inventory": (
            "inventory directory or .yaml file (default: fabric.yaml's fleetops.inventory)"
        ),
    }
)
def ssh_config(c, host=None, inventory=None):
    """Print an OpenSSH config block for the inventory (HostName, Port, User, IdentityFile,
    ProxyJump, UserKnownHostsFile, StrictHostKeyChecking yes). Save it (fab ssh-config >
    ~/.ssh/fleetops.conf), then ssh -F ~/.ssh/fleetops.conf lab01, or `Include fleetops.conf` at the
    top of ~/.ssh/config."""
    from ..report.oncall import show_ssh_config

    settings = c.config.get("fleetops") or {}
    code = show_ssh_config(
        settings.get("root"), inventory, settings.get("inventory", "hosts"), host
    )
    if code:
        raise SystemExit(code)


@explicit_task(name="lint", help={"playbook": HELP_PLAYBOOK, "json": HELP_JSON})
def playbook_lint(c, playbook=None, json=False):
    """Check a playbook without a node: schema, file references, regexes, diffs (parse, match their
    module), scripts (compile, patch scripts define transform). Each problem as file:line; exit 1 if
    any."""
    from ..report.lint import show_lint

    settings = c.config.get("fleetops") or {}
    code = show_lint(settings.get("root"), playbook, settings.get("playbook") or "", as_json=json)
    if code:
        raise Exit(code=code)


@explicit_task(help={"json": HELP_JSON})
def runbooks(c, json=False):
    """The operator runbooks (docs/runbooks/): the incident each one is for; every command in them
    runs in CI."""
    from ..report.runbooks import show_runbooks

    code = show_runbooks((c.config.get("fleetops") or {}).get("root"), as_json=json)
    if code:
        raise Exit(code=code)


# The host tasks' fab tasks are read from their declarations (tasks/declare.py); the local ones are
# above.
ns = Collection(
    *(from_declaration(task) for task in declared_tasks().values()), history, ssh_config, runbooks
)
if wants_lab(sys.argv):
    try:
        from ..lab import collection
    # the lab is a wheel of its own (fleetops-lab): say how to add it
    except ModuleNotFoundError as exc:
        if exc.name != "fleetops.lab":
            raise
        from .labhint import missing_lab

        ns.add_collection(missing_lab(), name="lab")
    else:
        ns.add_collection(collection(), name="lab")
ns.add_collection(Collection("playbook", playbook_lint), name="playbook")


@explicit_task(help={"json": HELP_JSON})
def connections(c, json=False):
    """The live ssh master connections (OpenSSH transport): host, user, port, jump, age, idle, pid,
    RSS; a master fleetops has no record of by its socket's name; stale sockets said. With -H: only
    those hosts'."""
    from ..report.masters import show_connections
    from ..wire.masters import survey

    code = show_connections(survey(_host_words(c)), as_json=json)
    if code:
        raise Exit(code=code)


@explicit_task(help={"json": HELP_JSON})
def disconnect(c, json=False):
    """Close the ssh master connections (`ssh -O exit`) of the -H hosts, every one without -H; a
    stale socket (its master gone) is removed. Says what it closed."""
    from ..report.masters import show_disconnect
    from ..wire.masters import disconnect as close_masters

    code = show_disconnect(close_masters(_host_words(c)), as_json=json)
    if code:
        raise Exit(code=code)


def _host_words(c) -> list[str] | None:
    """The -H words (the executor hands them to local tasks), None without -H."""
    words = [
        w
        for w in str((c.config.get("fleetops") or {}).get("cli_hosts") or "").split(",")
        if w.strip()
    ]
    return words or None


ns.add_task(connections)
ns.add_task(disconnect)


@explicit_task(
    positional=["directory"],
    help={
        "directory": (
            "the project's folder (`fleet init` alone: the working directory); made if missing"
        ),
        "force": "replace the project files that exist (the rest of the folder is left alone)",
    },
)
def init(c, directory, force=False):
    """Make a project here or in DIRECTORY: hosts/ (an example inventory), playbooks/ (the shipped
    playbook as a worked example), fabric.yaml and a one-line fabfile.py for Fabric's `fab`. Refuses
    to replace a file (exit 2) unless --force."""
    from ..report.init import show_init

    code = show_init(directory, force=force)
    if code:
        raise Exit(code=code)


def fleet_namespace() -> Collection:
    """`fleet`'s namespace: the project's tasks (`ns`) and `init`, which makes a project (no fabfile
    has it)."""
    out = Collection(init, *ns.tasks.values())
    for name, sub in ns.collections.items():
        out.add_collection(sub, name=name)
    return out
