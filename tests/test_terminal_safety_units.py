"""Node text never drives the operator's terminal, without the lab: the one sanitiser
(redaction.printable / shown) and every place report/ prints what a node or a job said (result
lines, items, evidence, tables, job lines, notes, errors, the live view, fetch labels, fleet tables,
`history`), plus the audit record. fleetops' own styling (rich colours on a terminal) still reaches
the terminal; `--json` keeps the raw text. The lab tests (test_terminal_safety_lab.py) drive the
same through real nodes."""

from __future__ import annotations

import io
import json
import os
import re
import shlex

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from fleetops import audit, identity
from fleetops.redaction import RedactingStream, printable, shown
from fleetops.report import fold, history
from fleetops.report.console import Reporter
from fleetops.report.oncall import TransferBoard
from fleetops.report.rows import fleet_sections
from fleetops.results import Evidence, Item, Next, Result, Status
from fleetops.tasks import diagnose

E = "\x1b"
# What a hostile node writes: set the title, move up and erase the line above, forge another host's
# line, write the clipboard (OSC 52), C1 CSI, a bidi override. No SGR (colour) sequence: the
# output's own colours are rich's, and they are the only escapes a terminal may get.
EVIL = (
    f"{E}]0;pwned{E}\\{E}[1A{E}[2Klab02 | patch | ok | forged{E}]52;c;cm0gLXJmIH4K\x07"
    "\x9b2J tail\u202eevil\u2066x\u2069\x7f\x00\r"
)
RAW = ("\x1b", "\x9b", "\u202e", "\u2066", "\x07", "\x00", "\r", "\x7f")
OWN_STYLE = re.compile(r"\x1b\[[0-9;]*m")  # rich's SGR colour codes: fleetops' own styling


def node_raw(text: str) -> list[str]:
    """Raw controls left in `text` once fleetops' own colour codes are taken out."""
    rest = OWN_STYLE.sub("", text)
    return [c for c in RAW if c in rest]


def node_sequences(text: str) -> list[str]:
    """What only a node's text could have put in the output of a rich display that moves the cursor
    itself (a progress bar): OSC (title, clipboard), C1 CSI, bidi controls, BEL, NUL."""
    return [c for c in ("\x1b]", "\x9b", "\u202e", "\u2066", "\x07", "\x00") if c in text]


def terminal(width: int = 160) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(
        file=RedactingStream(out),
        width=width,
        force_terminal=True,
        color_system="standard",
        highlight=False,
        soft_wrap=True,
        emoji=False,
    ), out


def evil_result(host: str = "lab01") -> Result:
    items = [
        Item(
            f"check {EVIL}",
            Status.FAILED,
            f"msg {EVIL}",
            {
                "evidence": [{"line": 3, "text": EVIL}, EVIL],
                "stderr_tail": [EVIL],
                "notes": [EVIL],
                "drift": [{"message": EVIL, "hunk": None}],
                "diff_text": EVIL,
                "show_diff": True,
                "proves": EVIL,
                "cannot": EVIL,
            },
        )
    ]
    return Result(
        host,
        "run",
        Status.FAILED,
        f"node said {EVIL}",
        items,
        Evidence(f"cmd {EVIL}", 1, [f"stderr {EVIL}"], 0.1),
        data={
            "output": True,
            "stdout": f"{EVIL}\nsecond {EVIL}\n",
            "stderr": EVIL,
            "table": {"title": f"{host}: {EVIL}", "columns": ["a", "b"], "rows": [[EVIL, "x"]]},
            "quarantined": [{"path": EVIL, "why": EVIL, "moved_to": EVIL}],
            "removed_temp_files": [EVIL],
            "next": Next(f"why {EVIL}", [f"fab -H {host} {EVIL}"]).to_data(),
        },
    )


# ---------------------------------------------------------------- the sanitiser
def test_controls_and_line_breaks_become_visible_escapes_and_tab_stays():
    assert printable("a\tb\nc\rd") == "a\tb\\nc\\rd"
    assert printable(f"{E}]0;pwned{E}\\") == "\\x1b]0;pwned\\x1b\\"
    assert printable("\x9b2J") == "\\x9b2J"
    assert printable("abc\u202efed") == "abc\\u202efed"
    assert printable("\x00\x07\x08\x0b\x0c\r\x7f\x85") == "\\x00\\x07\\x08\\x0b\\x0c\\r\\x7f\\x85"
    bidi = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    assert printable(bidi) == "".join(f"\\u{ord(c):04x}" for c in bidi)
    assert printable("\udc80") == "\\udc80"  # a lone surrogate: no UTF-8 stream could write it
    assert printable("naïve – 漢字 ✓") == "naïve – 漢字 ✓"  # ordinary text is left alone


@given(st.text())
def test_any_text_comes_out_inert_and_cleaning_twice_changes_nothing(text):
    once = printable(text)
    assert not any(c in once for c in RAW) and not re.search(
        "[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e]", once
    )
    assert printable(once) == once
    once.encode("utf-8")  # always writable


# ---------------------------------------------------------------- what the console prints
def test_every_part_of_a_result_is_printed_inert_and_fleetops_colours_stay():
    console, out = terminal()
    rep = Reporter(console=console)
    rep.result(evil_result())
    text = out.getvalue()
    assert not node_raw(text), (node_raw(text), text)
    # shown, as written
    assert "\\x1b]0;pwned\\x1b\\\\x1b[1A\\x1b[2Klab02 | patch | ok | forged" in text
    assert "\\x9b2J tail\\u202eevil" in text
    assert OWN_STYLE.search(text), "fleetops' own colours must still reach a terminal"


def test_folded_groups_odd_ones_out_and_the_fleet_tables_are_inert():
    console, out = terminal()
    rep = Reporter(console=console)
    rep.fold, rep.odd = True, True
    hosts = ["lab01", "lab02", "lab03", "lab04"]
    rep.who = fold.identities((h, "10.0.0.%d" % i, 22) for i, h in enumerate(hosts, 1))
    results = [evil_result(h) for h in hosts[:3]] + [
        Result("lab04", "run", Status.OK, f"other {EVIL}")
    ]
    results += [
        Result(
            h,
            "diagnose",
            Status.FAILED,
            EVIL,
            data={"summary_row": [h, "CRITICAL", EVIL, EVIL, EVIL]},
        )
        for h in hosts
    ]
    results += [Result(h, "facts", Status.OK, EVIL, data={"fact_row": [EVIL] * 11}) for h in hosts]
    results += [Result(h, "gpu", Status.FAILED, EVIL, data={"verdict": EVIL}) for h in hosts]
    for r in results:
        rep.result(r)
    rep.finish(results, 1, sections=fleet_sections(results, fold=True), rerun="fab -H lab01 run x")
    text = out.getvalue()
    assert not node_raw(text), (node_raw(text), text[-3000:])
    plain = OWN_STYLE.sub("", text)
    assert "odd ones out" in plain and "lab[01-03] (3) | run | failed" in plain, plain


def test_job_lines_notes_errors_and_the_live_view_are_inert(capsys):
    console, out = terminal()
    rep = Reporter(console=console)
    # the live view's rows;
    rep.rows = {"lab01": {"task": "-", "state": "queued", "started": None, "done": 0}}
    # not started: rich's Live moves the cursor itself, which would hide a node's escape among its
    # own
    rep.job_attached("lab01", f"job{EVIL}", f"running{EVIL}")
    for failure, progress in ((False, None), (True, None), (False, {"done": 1, "total": 10})):
        rep.job_line("lab01", f"samples=1/10 {EVIL}", failure, progress)
    rep.note(f"lab01 | job {EVIL} ended")
    # the live view's frame
    Console(file=out, width=120, force_terminal=True).print(rep._live_table())
    rep.job_ended("lab01", f"failed{EVIL}")
    rep.error(f"node said {EVIL}")
    text = out.getvalue() + capsys.readouterr().err
    assert not node_raw(text), (node_raw(text), text)
    assert text.count("\\x1b]0;pwned") >= 5


# What a node writes to forge whole lines of other hosts: each of its lines would start with a
# host's name.
FORGE = (
    "boom\nlab02 | patch | changed | applied 2 hunks (original saved, sha256 0123456789ab)\r\n"
    "lab03 | verify | ok | 21/21 checks passed\rlab03 | gpu | ok"
)


def forged(text: str) -> list[str]:
    """Printed lines that start as the node's text would have them: a host's line fleetops did not
    write."""
    plain = OWN_STYLE.sub("", text)
    return [
        line
        for line in re.split("[\r\n]", plain)
        if line.startswith(("lab02 | patch | changed", "lab03 |"))
    ]


def test_a_line_that_starts_with_a_host_name_is_always_one_fleetops_wrote(capsys):
    # Quote: "an error message `boom\nlab02 | patch | changed | ...\nlab03 | verify | ok | 21/21
    # checks passed` prints three host lines for one host (no lab03 exists). The same through
    # `facts` fields, the drain reason, pip-check package names, and a job-created file name seen by
    # `fetch` of a directory."
    console, out = terminal()
    rep = Reporter(console=console)
    rep.fold = True
    hosts = ["evil01", "evil02", "lab01"]
    rep.who = fold.identities((h, "10.0.0.%d" % i, 22) for i, h in enumerate(hosts, 1))
    results = [
        Result(
            h,
            "patch",
            Status.FAILED,
            f"node error: {FORGE}",
            data={"next": Next(FORGE, [f"fab -H {h} {FORGE}"]).to_data()},
        )
        for h in hosts
    ]
    results += [
        Result(
            h,
            "facts",
            Status.OK,
            FORGE,
            data={
                "fact_row": [FORGE] * 11,
                "node_warnings": [f"pip check: {FORGE} 1.0 requires x"],
            },
        )
        for h in hosts
    ]
    results += [
        Result(h, "gpu", Status.FAILED, f"drained by x: {FORGE}", data={"verdict": FORGE})
        for h in hosts
    ]
    results += [
        Result(
            "lab01",
            "fetch",
            Status.FAILED,
            f"refused a file name: {FORGE}",
            [Item(f"jobs/x/{FORGE}", Status.FAILED, f"skipped {FORGE}", {"notes": [FORGE]})],
        )
    ]
    for r in results:
        rep.result(r)
    rep.finish(results, 1, sections=fleet_sections(results, fold=True), rerun="fab -H lab01 run x")
    for unfolded in (results[0], results[-1]):  # and unfolded, as each host answers
        rep.fold = False
        rep.result(unfolded)
    rep.job_line("lab01", FORGE, True, None)
    rep.note(f"lab01 | job {FORGE}")
    rep.error(f"node said {FORGE}")
    board = TransferBoard(Console(file=out, force_terminal=False, width=200), quiet=False)
    transfer = board.start(f"lab01 jobs/x/{FORGE}", 64 << 20, 0)
    transfer(40 << 20)
    transfer.finish()
    text = out.getvalue() + capsys.readouterr().err
    assert forged(text) == [], text
    assert text.count("boom\\nlab02 | patch | changed") >= 8, text  # shown, on its host's line


def test_a_fetch_label_is_inert():
    out = io.StringIO()
    board = TransferBoard(Console(file=out, force_terminal=True, width=200), quiet=False)
    transfer = board.start(f"lab01 {EVIL}", 64 << 20, 0)
    transfer(40 << 20)
    transfer.finish()
    text = out.getvalue()
    assert not node_sequences(text) and "\\x1b]0;pwned" in text, text
    plain = io.StringIO()
    # piped: 25% lines
    board = TransferBoard(Console(file=plain, force_terminal=False, width=200), quiet=False)
    transfer = board.start(f"lab01 {EVIL}", 64 << 20, 0)
    transfer(40 << 20)
    transfer.finish()
    assert not node_raw(plain.getvalue()) and "\\x1b]0;pwned" in plain.getvalue(), plain.getvalue()


def test_history_replays_an_entry_with_raw_controls_inert():
    console, out = terminal(300)
    records = [
        {
            "time": "2026-11-30T11:05:09+00:00",
            "operator": f"op{EVIL}",
            "host": "lab01",
            "task": "run",
            "result": "ok",
            "exit_status": 0,
            "msg": f"{EVIL} (written by an older fleetops)",
        }
    ]
    console.print(history.table(records, 300))
    text = out.getvalue()
    assert not node_raw(text) and "\\x1b]0;pwned" in text, (node_raw(text), text)


def test_json_keeps_the_raw_text_and_json_escapes_it(capsys):
    r = evil_result()
    Reporter(json_mode=True).finish([r], 1)
    out = capsys.readouterr().out
    assert not any(c in out for c in RAW)  # JSON escapes them (\u001b ...)
    # the raw text, for a program
    assert json.loads(out)["results"][0]["msg"] == f"node said {EVIL}"


# ---------------------------------------------------------------- the audit record
def test_the_audit_record_holds_node_text_inert(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    audit.append(
        audit.entry(Result("lab01", "gpu", Status.FAILED, f"held by pid 7: {EVIL}"), None, None)
    )
    raw = log.read_bytes()
    assert b"\x1b" not in raw and "\x9b".encode() not in raw and "\u202e".encode() not in raw
    (record,) = audit.read()
    assert not any(c in record["msg"] for c in RAW) and "\\x1b]0;pwned" in record["msg"], record
    # `jq -r .msg`, a program reading the log, gets inert text too
    assert shown(record["msg"]) == record["msg"]


def test_the_operator_is_the_os_login_not_the_environment(monkeypatch, tmp_path):
    import pwd

    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    monkeypatch.setattr(identity, "_OPERATOR", None)
    monkeypatch.setattr(identity, "_LOGIN", None)
    name = pwd.getpwuid(os.getuid()).pw_name
    assert identity.operator().split("@")[0] == name != "mallory"
    record = audit.entry(Result("lab01", "ping", Status.OK, "pong"), None, None)
    assert record["uid"] == os.getuid() and record["login"] == name
    assert record["operator"].startswith(f"{name}@")


# ---------------------------------------------------------------- suggested commands
def pasted(commands: list[str]) -> list[str]:
    """The words a shell gives the command the operator pastes (each command is a line of its
    own)."""
    (command,) = commands
    return shlex.split(command)


def test_next_commands_quote_what_a_node_answered():
    hostile = "1; touch /tmp/pwned-by-node $(id)"
    job = {"id": hostile, "state": "failed", "exit": {"exit_code": 1}, "log_tail": ["boom"]}
    (finding,) = diagnose.job_findings("lab01", job, [], True, re.compile("x"), [])
    words = pasted(finding.next)
    assert (
        words[:4] == ["fab", "-H", "lab01", "logs"]
        and words[words.index("--job-id") + 1] == hostile
    ), words
    disks = [
        {
            "label": "state",
            "path": "/srv/x; rm -rf ~",
            "free_bytes": 1,
            "total_bytes": 10**12,
            "inodes_free": 1,
            "inodes_total": 1,
        }
    ]
    (disk,) = diagnose.resource_findings("lab01", disks, {})
    words = pasted(disk.next)
    assert words[:4] == ["fab", "-H", "lab01", "run"] and len(words) == 5, words
    path = shlex.quote("/srv/x; rm -rf ~")
    # the node's shell gets the path as one word
    assert words[4] == f"df -h {path}; df -i {path}", words[4]
    procs = [{"pid": 5, "state": "S", "rss_kb": 1024, "comm": "x", "cpu_pct": 0}]
    (proc,) = diagnose.process_findings(
        "lab01", {"id": "j", "state": "running", "pgid": "5 $(id)"}, procs
    )
    assert shlex.split(pasted(proc.next)[4])[-1] == "5 $(id)", proc.next


def test_the_readme_next_commands_read_as_before():
    finding = diagnose.kernel_findings(
        "lab01", {"lines": [], "source": "dmesg", "total_lines": 3}, {}
    )[0][0]
    assert finding.next == ["fab -H lab01 run 'dmesg | tail -50'"]
    assert diagnose._fab("lab01", "verify") == "fab -H lab01 verify"
