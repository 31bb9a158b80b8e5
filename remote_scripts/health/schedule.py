"""Verification on a schedule, run by the node itself: `fleet schedule -H HOSTS verify --every 15m`
installs a systemd timer (system units as root, user units otherwise) or, where systemd is not the
init, a crontab entry of the login user. What it runs is the verified agent, started as the client
starts it: nothing new listens on the network, and nothing in the state dir is trusted for being
there.

The scheduled command line carries every hash it trusts (crontab and unit files are the user's or
root's own):

    cd STATE/schedule && PYTHON -I -S -c LAUNCHER  bootstrap-<sha>.py BOOTSTRAP_SHA256
        .. ../bin/<agent>.pyz AGENT_SHA256  scheduled NAME.request REQUEST_SHA256
        >>NAME.log 2>&1 || { rm -f -- TEXTFILE; exit 1; }

(paths relative to the schedule's folder keep the line within cron's 1000 characters; the bootstrap
walks the state dir from / all the same)

LAUNCHER (one line: a crontab line has no newline and turns `%` into one) reads the bootstrap's
text, runs it only if its sha256 is the one on the command line; the bootstrap then checks the state
dir like StrictModes and the agent's zip against its sha256 (core/bootstrap.py), and the role
`scheduled` below runs the stored request only if its sha256 is the one on the command line too. A
refusal anywhere writes its line into the log and exits non-zero, and the shell then removes the
textfile: a tampered node never keeps a metric that claims it is fine.

The role runs the request's ops (patch in check mode, verify: read-only) as the agent serves a
client's, writes the node's textfile (core/exposition.py: the metric names and label rules of the
client's --metrics) atomically into node_exporter's textfile directory, and prints one line for the
log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from hashlib import sha256

from ..core.atomicio import atomic_write, ensure_dir, open_write_dir
from ..core.nodeio import NodeError, now_iso
from ..core.protocol import PROTOCOL
from ..core.registry import node_op, node_role
from ..core.statetrust import read_json

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..core.exposition import Exposition

SUBDIR = "schedule"
ROLE = "scheduled"
NAMES = ("verify",)  # what may be scheduled
DEFAULT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's and Ubuntu's node_exporter
MARK = "# fleetops-schedule:"  # ends each crontab line fleetops wrote: KEY follows
LAUNCHER = (
    'import sys,hashlib;a=sys.argv;f=open(a[1],"rb");d=f.read();f.close();'
    'hashlib.sha256(d).hexdigest()==a[2] or sys.exit("fleetops: "+a[1]+" is not the bootstrap '
    'this schedule was installed with: refusing to run it");del a[1:3];exec(compile(d,"<fleetops '
    'bootstrap>","exec"))'
)
MAX_CRON_COMMAND = 999  # Debian's cron refuses a longer command ("command too long")
SYSTEM_UNITS = "/etc/systemd/system"
# a crontab line turns % into a newline; systemd expands it: refused in any word
UNSAFE = frozenset("%\n\r\0")
# what a scheduled request may run: read-only ops (patch only in its check mode)
ALLOWED = {"verify": lambda r: True, "patch": lambda r: r.get("check") is True}


def _shell_word(word: str) -> str:
    return (
        word
        if word and all(c.isalnum() or c in "@%+=:,./_-" for c in word)
        else "'" + word.replace("'", "'\"'\"'") + "'"
    )


def _unit_word(word: str) -> str:
    """A word of a unit's ExecStart: double-quoted, with systemd's own escapes ($ and % are refused
    earlier)."""
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def key_of(state_dir: str, name: str) -> str:
    """One schedule's id: the state dir and the name (one node may have several state dirs, one per
    user)."""
    return sha256(f"{os.path.abspath(state_dir)}\0{name}".encode()).hexdigest()[:12]


def paths(state_dir: str, name: str) -> dict[str, str]:
    folder = os.path.join(state_dir, SUBDIR)
    return {
        "dir": folder,
        "request": os.path.join(folder, f"{name}.request"),
        "record": os.path.join(folder, f"{name}.json"),
        "log": os.path.join(folder, f"{name}.log"),
    }


def textfile_name(name: str, host: str) -> str:
    """fleetops-verify-HOST.prom: named by the inventory host too, so hosts that share a machine
    (and its node_exporter) keep a file each."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host)[:64] or "host"
    return f"fleetops-{name}-{safe}.prom"


def unit_name(state_dir: str, name: str) -> str:
    return f"fleetops-{name}-{key_of(state_dir, name)}"


def interval_words(every_s: int) -> tuple[str, str]:
    """(crontab's five fields, systemd's OnCalendar) for a whole number of minutes dividing an hour,
    or of hours dividing a day: both run at the same wall-clock times."""
    minutes = every_s // 60
    if every_s % 60 or minutes < 1:
        raise NodeError(f"--every {every_s}s: whole minutes only", "bad_request")
    if minutes < 60 and 60 % minutes == 0:
        return (f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"), f"*-*-* *:00/{minutes}:00"
    if minutes % 60 == 0 and 24 % (minutes // 60) == 0:
        hours = minutes // 60
        return (f"0 */{hours} * * *" if hours > 1 else "0 * * * *"), f"*-*-* 00/{hours}:00:00"
    raise NodeError(
        f"--every {minutes}m: a number of minutes that divides an hour (1m, 5m, 15m, 30m...) or of "
        "hours that divides a day (1h, 2h, 6h, 12h, 24h)",
        "bad_request",
    )


def command_words(
    agent_argv: list[str], bootstrap_name: str, request_name: str, request_sha: str
) -> list[str]:
    """The scheduled argv from the running agent's own (launch.relaunch: python, flags, -c, the
    bootstrap's text, state dir, zip, sha256, flags), run from the schedule's folder: the
    bootstrap's text is replaced by the launcher and the stored copy's name and hash; the state dir
    is `..` from there."""
    at = agent_argv.index("-c")
    text, state_dir, pyz = agent_argv[at + 1 : at + 4]
    return [
        *agent_argv[:at],
        "-c",
        LAUNCHER,
        bootstrap_name,
        sha256(text.encode()).hexdigest(),
        "..",
        f"../bin/{os.path.basename(pyz)}",
        *agent_argv[at + 4 :],
        ROLE,
        request_name,
        request_sha,
    ]


def shell_line(folder: str, words: list[str], log: str, textfile: str) -> str:
    """What /bin/sh runs, from the schedule's folder: the log gets the run's lines, and a run that
    refused (or could not start) leaves no textfile behind."""
    for word in [folder, *words, log, textfile]:
        if UNSAFE & set(word):
            raise NodeError(
                f"cannot schedule with {word[:80]!r}: a % "
                "or a line break in a path breaks a crontab "
                "line; choose a state dir and textfile directory without them",
                "bad_request",
            )
    run = " ".join(_shell_word(w) for w in words)
    gone = f"{{ rm -f -- {_shell_word(textfile)}; exit 1; }}"
    return f"cd {_shell_word(folder)} && {run} >>{_shell_word(log)} 2>&1 || {gone}"


def cron_line(every_s: int, line: str, key: str) -> str:
    return f"{interval_words(every_s)[0]} {line} {MARK}{key}"


def units(
    name: str, state_dir: str, every_s: int, words: list[str], textfile: str, user: bool
) -> dict[str, str]:
    """The service and timer of one schedule (systemd-analyze verify accepts them)."""
    unit = unit_name(state_dir, name)
    where = paths(state_dir, name)
    log = os.path.abspath(where["log"])
    shell_line(where["dir"], words, log, textfile)  # the same refusals as for cron
    if _shell_word(textfile) != textfile:
        raise NodeError(
            f"cannot schedule with the textfile {textfile[:200]!r}: "
            "letters, digits and ./_- only in its "
            "path, please",
            "bad_request",
        )
    service = "\n".join(
        [
            "[Unit]",
            f"Description=fleetops: scheduled {name} of this node (fleet schedule --list)",
            "",
            "[Service]",
            "Type=oneshot",
            f"WorkingDirectory={os.path.abspath(where['dir'])}",
            "ExecStart=" + " ".join(_unit_word(w) for w in words),
            f"StandardOutput=append:{log}",
            f"StandardError=append:{log}",
            # a run that refused leaves no textfile claiming the node is fine
            f"ExecStopPost=/bin/sh -c 'test \"$$SERVICE_RESULT\" = success || rm -f -- {textfile}'",
            "",
            "",
        ]
    )
    timer = "\n".join(
        [
            "[Unit]",
            f"Description=fleetops: scheduled {name} of this node, every {every_s // 60} min",
            "",
            "[Timer]",
            f"OnCalendar={interval_words(every_s)[1]}",
            "Persistent=true",
            "",
            "[Install]",
            "WantedBy=timers.target",
            "",
            "",
        ]
    )
    return {f"{unit}.service": service, f"{unit}.timer": timer}


# ---------------------------------------------------------------- where it is installed
def has_systemd() -> bool:
    """systemd is the init (sd_booted(3)): timers then; cron otherwise (a container, an old
    init)."""
    return os.path.isdir("/run/systemd/system")


def _crontab(*args: str, text: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["crontab", *args], input=text, capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        raise NodeError(
            "neither systemd nor cron's crontab is on this node: install cron (Debian: apt-get "
            "install cron) or run the schedule from an ops machine (docs/monitoring.md)",
            "no_scheduler",
        ) from None


def read_crontab() -> list[str]:
    got = _crontab("-l")
    if got.returncode != 0:
        if "no crontab" in got.stderr:
            return []
        raise NodeError(f"crontab -l failed: {got.stderr.strip()[:300]}", "cron")
    return got.stdout.splitlines()


def write_crontab(lines: list[str]) -> None:
    got = _crontab("-", text="".join(f"{line}\n" for line in lines))
    if got.returncode != 0:
        raise NodeError(f"crontab refused the new table: {got.stderr.strip()[:300]}", "cron")


def _systemctl(user: bool, *args: str) -> None:
    got = subprocess.run(
        ["systemctl", *(["--user"] if user else []), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if got.returncode != 0:
        raise NodeError(f"systemctl {' '.join(args)} failed: {got.stderr.strip()[:300]}", "systemd")


def _unit_dir(user: bool) -> str:
    return (
        os.path.join(os.path.expanduser("~"), ".config", "systemd", "user")
        if user
        else SYSTEM_UNITS
    )


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- the op
@node_op("schedule", writes=True)
def schedule(req: dict) -> dict:
    action = req.get("action")
    if action == "list":
        return {"ok": True, "schedules": listed(req["state_dir"])}
    name = req.get("name")
    if name not in NAMES:
        raise NodeError(f"cannot schedule {name!r}: only {', '.join(NAMES)}", "bad_request")
    if action == "install":
        return install(req, name)
    if action == "remove":
        return remove(req["state_dir"], name, bool(req.get("check")))
    raise NodeError(f"unknown schedule action {action!r}", "bad_request")


def install(req: dict, name: str) -> dict:
    wanted = _Wanted(req, name)
    old = _read_record(wanted.where["record"])
    same_files = wanted.same_files()
    table, ours, same_entry = wanted.present()
    record = wanted.record(str(req.get("operator") or "?"), old)
    answer = wanted.answer()
    if same_files and same_entry and old is not None:
        return {
            **answer,
            "changed": False,
            "since": old.get("since"),
            "by": old.get("by"),
            "why": f"already installed: the same command every {wanted.every_s // 60} min since "
            f"{old.get('since')} (by {old.get('by')})",
        }
    # `ours` is empty where the backend is systemd
    answer.update(changed=True, replaced=old is not None or bool(ours))
    if req.get("check"):
        return answer
    wanted.put(table, record)
    return {**answer, "since": record["since"], "by": record["by"]}


def _textfile_path(req: dict, name: str) -> str:
    return os.path.join(
        os.path.abspath(req.get("textfile_dir") or DEFAULT_TEXTFILE_DIR),
        textfile_name(name, str(req.get("host") or "")),
    )


def _stored_requests(req: dict, state_dir: str) -> list[dict]:
    """The request's inner requests as the scheduled run serves them; anything but a read-only
    check is refused."""
    requests = []
    for inner in req.get("requests") or []:
        if inner.get("op") not in ALLOWED or not ALLOWED[inner["op"]](inner):
            raise NodeError(
                f"a schedule runs only read-only checks, not {inner.get('op')!r}", "bad_request"
            )
        requests.append(
            {**inner, "protocol": PROTOCOL, "state_dir": state_dir, "host": req.get("host") or ""}
        )
    return requests


class _Wanted:
    """What one install puts on the node: the stored request and bootstrap, and the crontab line
    or the systemd units that run them. Building it refuses what cannot be scheduled."""

    def __init__(self, req: dict, name: str) -> None:
        self.name = name
        self.state_dir = req["state_dir"]
        self.where = paths(self.state_dir, name)
        self.textfile = _textfile_path(req, name)
        self.every_s = int(req["every_s"])
        interval_words(self.every_s)
        requests = _stored_requests(req, self.state_dir)
        self.document = {
            "host": req.get("host") or "",
            "playbook": req.get("playbook") or "",
            "name": name,
            "textfile": self.textfile,
            "requests": requests,
        }
        self.request_bytes = (json.dumps(self.document, sort_keys=True) + "\n").encode()
        self.request_sha = sha256(self.request_bytes).hexdigest()
        self._command()
        self.backend = "systemd" if has_systemd() else "cron"
        self.user = os.geteuid() != 0
        self.key = key_of(self.state_dir, name)
        self.units: dict[str, str] = {}
        if self.backend == "systemd":
            self.units = units(
                name, self.state_dir, self.every_s, self.words, self.textfile, self.user
            )
        self.cron = cron_line(self.every_s, self.line, self.key)
        if self.backend == "cron":
            self._refuse_long_cron()

    def _command(self) -> None:
        """The stored bootstrap (the running agent's) and the command line that runs it."""
        from ..core.launch import relaunch

        agent_argv = relaunch()
        self.bootstrap_text = agent_argv[agent_argv.index("-c") + 1].encode()
        self.bootstrap_path = os.path.join(
            self.where["dir"], f"bootstrap-{sha256(self.bootstrap_text).hexdigest()[:16]}.py"
        )
        self.words = command_words(
            agent_argv,
            os.path.basename(self.bootstrap_path),
            os.path.basename(self.where["request"]),
            self.request_sha,
        )
        self.line = shell_line(
            os.path.abspath(self.where["dir"]),
            self.words,
            os.path.basename(self.where["log"]),
            self.textfile,
        )

    def _refuse_long_cron(self) -> None:
        if len(self.line) + len(MARK) + len(self.key) + 1 > MAX_CRON_COMMAND:
            raise NodeError(
                f"the scheduled command would be {len(self.line)} characters, and cron takes at "
                f"most {MAX_CRON_COMMAND}: give this host a shorter "
                "state_dir, python or --textfile-dir path",
                "bad_request",
            )

    def same_files(self) -> bool:
        if _read(self.where["request"]) != self.request_bytes:
            return False
        return _read(self.bootstrap_path) == self.bootstrap_text

    def present(self) -> tuple[list[str], list[str], bool]:
        """The crontab as it is (cron only), the lines of it that are this schedule's, and whether
        the crontab line or the units are already the ones wanted."""
        if self.backend == "cron":
            table = read_crontab()
            ours = [x for x in table if x.endswith(f"{MARK}{self.key}")]
            return table, ours, ours == [self.cron]
        folder = _unit_dir(self.user)
        same = all(
            _read(os.path.join(folder, n)) == text.encode() for n, text in self.units.items()
        )
        return [], [], same

    def record(self, by: str, old: dict | None) -> dict:
        """What the schedule's record says (fleet schedule --list, and remove, read it)."""
        return {
            "name": self.name,
            "host": self.document["host"],
            "playbook": self.document["playbook"],
            "every_s": self.every_s,
            "backend": self.backend,
            "scope": "user" if self.user else "system",
            "textfile": self.textfile,
            "log": self.where["log"],
            "by": by,
            "since": (old or {}).get("since") or now_iso(),
            "updated": now_iso(),
            "request_sha256": self.request_sha,
            "key": self.key,
            "units": sorted(self.units),
            "command": self.line,
            "bootstrap": os.path.basename(self.bootstrap_path),
        }

    def answer(self) -> dict:
        return {
            "ok": True,
            "backend": self.backend,
            "scope": "user" if self.user else "system",
            "textfile": self.textfile,
            "command": self.line,
            "every_s": self.every_s,
            "units": self.units,
            "cron_line": self.cron if self.backend == "cron" else None,
        }

    def put(self, table: list[str], record: dict) -> None:
        """Write the files, then the crontab line or the units, then the record."""
        ensure_dir(self.where["dir"])
        atomic_write(self.bootstrap_path, self.bootstrap_text, mode=0o600, point="schedule")
        atomic_write(self.where["request"], self.request_bytes, mode=0o600, point="schedule")
        if self.backend == "cron":
            write_crontab([x for x in table if not x.endswith(f"{MARK}{self.key}")] + [self.cron])
        else:
            self._put_units()
        atomic_write(
            self.where["record"],
            (json.dumps(record, indent=1, sort_keys=True) + "\n").encode(),
            mode=0o600,
            point="schedule",
        )
        _forget_other_bootstraps(self.where["dir"])

    def _put_units(self) -> None:
        folder = _unit_dir(self.user)
        if self.user:
            os.makedirs(folder, 0o700, exist_ok=True)
        for unit, text in self.units.items():
            atomic_write(os.path.join(folder, unit), text.encode(), mode=0o644, point="schedule")
        _systemctl(self.user, "daemon-reload")
        _systemctl(self.user, "enable", "--now", f"{unit_name(self.state_dir, self.name)}.timer")


def _read_record(path: str) -> dict | None:
    try:
        return read_json(path)
    except NodeError:
        return None


def _forget_other_bootstraps(folder: str) -> None:
    """A bootstrap no schedule's record names any more (the agent was updated since) goes."""
    named = {
        (_read_record(os.path.join(folder, n)) or {}).get("bootstrap")
        for n in os.listdir(folder)
        if n.endswith(".json")
    }
    for entry in os.listdir(folder):
        if entry.startswith("bootstrap-") and entry not in named:
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass


def remove(state_dir: str, name: str, check: bool) -> dict:
    where = paths(state_dir, name)
    key = key_of(state_dir, name)
    record = _read_record(where["record"])
    user = os.geteuid() != 0
    unit = unit_name(state_dir, name)
    unit_files = [os.path.join(_unit_dir(user), f"{unit}.{kind}") for kind in ("timer", "service")]
    table = _crontab_of(record)
    found = _found(table, key, unit_files, unit)
    if not found and record is None:
        return {
            "ok": True,
            "changed": False,
            "why": f"no {name} schedule is installed here",
            "removed": [],
        }
    if check:
        return {"ok": True, "changed": True, "removed": found, "record": record}
    if "crontab entry" in found and table is not None:
        write_crontab([x for x in table if not x.endswith(f"{MARK}{key}")])
    _remove_units(user, unit, unit_files)
    # its last metrics would otherwise stand, as if still verified
    textfile = (record or {}).get("textfile")
    if isinstance(textfile, str) and textfile:
        _unlink_in(textfile)
        found.append(textfile)
    for path in (where["request"], where["record"]):
        if os.path.lexists(path):
            os.unlink(path)
    return {"ok": True, "changed": True, "removed": found, "record": record}


def _crontab_of(record: dict | None) -> list[str] | None:
    """The crontab, unless the record says the schedule is systemd's or it cannot be read."""
    if record is not None and record.get("backend") == "systemd":
        return None
    try:
        return read_crontab()
    except NodeError:
        return None


def _found(table: list[str] | None, key: str, unit_files: list[str], unit: str) -> list[str]:
    """What of one schedule is there: its crontab entry, its systemd timer."""
    found = []
    if table is not None and any(x.endswith(f"{MARK}{key}") for x in table):
        found.append("crontab entry")
    if any(os.path.lexists(p) for p in unit_files):
        found.append(f"systemd {unit}.timer")
    return found


def _remove_units(user: bool, unit: str, unit_files: list[str]) -> None:
    if not any(os.path.lexists(p) for p in unit_files):
        return
    _systemctl(user, "disable", "--now", f"{unit}.timer")
    for path in unit_files:
        if os.path.lexists(path):
            os.unlink(path)
    _systemctl(user, "daemon-reload")


def _unlink_in(path: str) -> None:
    folder, base = os.path.split(path)
    try:
        fd = open_write_dir(folder, path)
    except FileNotFoundError:
        return
    try:
        os.unlink(base, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def listed(state_dir: str) -> list[dict]:
    """Every schedule of this state dir: its record, and whether its crontab line or timer is still
    there as installed (someone may have edited the crontab by hand)."""
    folder = os.path.join(state_dir, SUBDIR)
    try:
        names = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    table: list[str] | None = None
    out = []
    for name in names:
        record = _read_record(os.path.join(folder, f"{name}.json"))
        if record is None:
            continue
        if record.get("backend") == "cron":
            if table is None:
                try:
                    table = read_crontab()
                except NodeError:
                    table = []
            present = [x for x in table if x.endswith(f"{MARK}{record.get('key')}")]
            record["installed"] = bool(present)
            record["as_installed"] = present == [
                cron_line(int(record["every_s"]), record["command"], record["key"])
            ]
        else:
            folder_units = _unit_dir(record.get("scope") == "user")
            record["installed"] = all(
                os.path.exists(os.path.join(folder_units, u)) for u in record.get("units", [])
            )
            record["as_installed"] = record["installed"]
        out.append(record)
    return out


# ---------------------------------------------------------------- the scheduled run
@node_role(ROLE)
def scheduled(request_path: str, want: str, *rest: str) -> int:
    """Run the stored request if its bytes have the sha256 the command line carries; write the
    textfile."""
    started = time.time()
    data = _read(request_path)
    if data is None or sha256(data).hexdigest() != want:
        got = "missing" if data is None else f"sha256 {sha256(data).hexdigest()}"
        _log(
            f"refusing to run {request_path}: {got}, expected "
            f"{want} (the request this schedule was installed "
            "with); nothing run, its textfile removed. Check "
            "who changed it, then run fleet schedule again"
        )
        return 3
    doc = json.loads(data)
    from ..core.agent import serve
    from ..core.exposition import Exposition
    from ..core.registry import OPS

    host = str(doc.get("host") or "")
    out = Exposition()
    said = []
    for request in doc["requests"]:
        op = request.get("op")
        if op not in ALLOWED or not ALLOWED[op](request):
            _log(
                f"refusing to run {op!r} from {request_path}: a schedule runs only read-only checks"
            )
            return 3
        _load(op)
        answer = serve(json.dumps(request).encode(), OPS.get)
        if answer.get("error"):
            _log(f"{host}: {op} refused: {answer['error']}")
            return 1
        said.append(_METRICS[op](out, host, doc, answer))
        out.add("fleetops_last_run_timestamp_seconds", round(time.time(), 3), task=op)
    atomic_write(doc["textfile"], out.text().encode(), mode=0o644, point="metrics")
    _log(f"{host}: {'; '.join(said)}; wrote {doc['textfile']} in {time.time() - started:.2f}s")
    return 0


def _patch_metrics(out: Exposition, host: str, doc: dict, answer: dict) -> str:
    """One file-state series per patched module; the line says how many files are in each
    state."""
    from ..core.exposition import PATCH_STATE_OF, add_patch_states

    items = answer.get("items") or []
    add_patch_states(
        out, host, [{"label": i.get("module"), "state": i.get("status")} for i in items]
    )
    states = [PATCH_STATE_OF.get(str(i.get("status")), "unknown") for i in items if i.get("module")]
    return "files " + ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))


def _verify_metrics(out: Exposition, host: str, doc: dict, answer: dict) -> str:
    """One series per check (its `requires` left out) and the run's seconds; the line says how
    many passed."""
    items = [i for i in answer.get("items") or [] if i.get("kind") != "requires"]
    for item in items:
        out.add(
            "fleetops_check_ok",
            1 if item.get("ok") else 0,
            host=host,
            playbook=doc.get("playbook", ""),
            check=item.get("name", ""),
            kind=item.get("kind", ""),
        )
    out.add("fleetops_verify_seconds", float(answer.get("seconds") or 0), host=host)
    return f"{sum(1 for i in items if i.get('ok'))}/{len(items)} checks passed"


# how each op's answer becomes series in the textfile, and the log line's words about it
_METRICS: dict[str, Callable[[Exposition, str, dict, dict], str]] = {
    "patch": _patch_metrics,
    "verify": _verify_metrics,
}


def _load(op: str) -> None:
    """The module that declares `op` (the manifest is the floor above this one)."""
    if op == "verify":
        from ..checks import checks  # noqa: F401
    else:
        from . import guard  # noqa: F401


def _log(line: str) -> None:
    sys.stdout.write(f"{now_iso()} fleetops scheduled run: {line}\n")
    sys.stdout.flush()
