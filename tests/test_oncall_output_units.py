"""What an on-call engineer reads at 80 columns, pure parts (report/, no sshd): ids never cut, next
commands whole on their own lines with the real host, short output by default (-v for the rest),
folding from two hosts, recap and facts in host order, a tail's progress shown once."""

from __future__ import annotations

import io
import re
import shlex

from rich.console import Console

from fleetops.plans.gpugate import Gate
from fleetops.report import fold
from fleetops.report.console import Reporter
from fleetops.report.rows import fleet_sections
from fleetops.results import Evidence, Item, Result, Status
from fleetops.results.gpu import Facts
from fleetops.tasks import diagnose
from fleetops.tasks.gpu import _interpret_gpu
from fleetops.tasks.jobs import interpret_jobs_list
from fleetops.tasks.plan import Plan

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
IDS = [
    "extract-20261202T014412-9f3a",
    "extract-20261201T220155-04be",
    "numbers-20261201T101010-7c1d",
]


def reporter(
    hosts: list[str],
    width: int = 80,
    fold_on: bool = False,
    verbose: bool = False,
    terminal: bool = False,
) -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    rep = Reporter(
        verbose=verbose,
        console=Console(
            file=out, width=width, highlight=False, soft_wrap=True, force_terminal=terminal or None
        ),
    )
    rep.fold = fold_on
    rep.who = fold.identities((h, "127.0.0.1", 2200 + i) for i, h in enumerate(hosts))
    return rep, out


def commands_in(text: str) -> list[str]:
    """The lines of the screen that are a command and nothing else (what triple-click copies)."""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("fab ")]


# ---------------------------------------------------------------- ids and commands whole at 80
# columns
def jobs_answer() -> dict:
    jobs = [
        {
            "id": IDS[0],
            "name": "extract",
            "state": "killed",
            "started": "2026-12-02T01:44:12Z",
            "runtime_s": 3,
            "exit": {"signal": 9},
            "log_bytes": 154,
            "output_bytes": 0,
        },
        {
            "id": IDS[1],
            "name": "extract",
            "state": "succeeded",
            "started": "2026-12-01T22:01:55Z",
            "runtime_s": 65,
            "exit": {"exit_code": 0},
            "log_bytes": 1536,
            "output_bytes": 10 * 2**20,
        },
        {
            "id": IDS[2],
            "name": "numbers",
            "state": "running",
            "started": "2026-12-01T10:10:10Z",
            "runtime_s": 4000,
            "exit": None,
            "log_bytes": 99,
            "output_bytes": None,
        },
    ]
    return {"jobs": jobs, "total": 3, "latest": IDS[0], "jobs_dir": "/srv/state/jobs"}


def test_jobs_at_80_columns_show_every_id_whole():
    rep, out = reporter(["lab01"])
    result = interpret_jobs_list("lab01", Plan("jobs_list", {}, 60, None), jobs_answer())
    rep.result(result)
    text = out.getvalue()
    for job_id in IDS:
        assert any(job_id in line for line in text.splitlines()), text
    assert "…" not in text, text
    assert " ID" not in text, text  # the footer names a real id to paste, not a placeholder
    assert f"fab -H lab01 status --job-id {IDS[0]}" in commands_in(text), text


def test_a_table_too_wide_for_the_terminal_wraps_between_words_never_inside_one():
    from fleetops.report.console import render_table

    spec = {
        "title": "t",
        "columns": ["host", "what", "note"],
        "rows": [
            ["lab01", "a-very-long-identifier-that-must-stay-whole-0123456789", "some words " * 6]
        ],
    }
    for width in (80, 60, 40):
        out = io.StringIO()
        Console(file=out, width=width, soft_wrap=True).print(render_table(spec))
        text = out.getvalue()
        assert "a-very-long-identifier-that-must-stay-whole-0123456789" in text, (width, text)
        assert "…" not in text, (width, text)


def oom_findings(host: str) -> list[diagnose.Finding]:
    job = IDS[0]
    oom = diagnose.Finding(
        diagnose.CRITICAL,
        "oom",
        f"the kernel OOM killer killed job {job}'s main process: pid 4242",
        [diagnose._fab(host, "logs", "--job-id", job)],
        rank=3,
        why="read the end of the job's log; then give it less to hold in memory",
    )
    unpatched = diagnose.Finding(
        diagnose.WARN,
        "patch",
        "not patched: 2 files as installed",
        [diagnose._fab(host, "patch", "verify")],
        rank=30,
        why="patch the node, then prove it",
    )
    reach = diagnose.Finding(
        diagnose.OK, "reach", "reached in 0.1s", [diagnose._fab(host, "ping")], rank=0, why=""
    )
    return [oom, unpatched, reach]


def test_diagnose_next_commands_are_whole_lines_with_the_real_host():
    rep, out = reporter(["lab01"])
    r = diagnose._result("lab01", sorted(oom_findings("lab01"), key=lambda f: f.order), {})
    rep.result(r)
    text = out.getvalue()
    assert f"fab -H lab01 logs --job-id {IDS[0]}" in commands_in(text), text
    assert "fab -H lab01 patch verify" in commands_in(text), text
    assert "{host}" not in text, text
    assert "fab -H lab01 ping" not in text, text  # an OK finding's command only under -v


def test_folded_hosts_get_their_host_range_in_next_commands_never_a_placeholder():
    hosts = ["lab01", "lab02", "lab03"]
    gate = Plan("gpu", {}, 60, None, options={"gate": Gate(expected=2), "wait": 0.0})
    gpus = [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-0",
            "memory_used_mib": 0,
            "memory_total_mib": 143771,
            "memory_free_mib": 143771,
            "ecc_uncorrected": 0,
            "processes": [],
        }
    ]
    results = [_interpret_gpu(h, gate, {"ok": True, "gpus": gpus}) for h in hosts]
    unpatched = [diagnose._result(h, [oom_findings(h)[1]], {}) for h in hosts]
    rep, out = reporter(hosts, fold_on=True)
    rep.finish(results + unpatched, 11)
    text = out.getvalue()
    assert "{host}" not in "\n".join(commands_in(text)), text
    assert "fab -H 'lab[01-03]' diagnose" in commands_in(text), text
    assert "fab -H 'lab[01-03]' patch verify" in commands_in(text), text
    for command in commands_in(text):
        assert shlex.split(command)[:3] == ["fab", "-H", "lab[01-03]"], command


def test_the_fleet_summary_of_diagnose_holds_no_command_cells():
    results = [diagnose._result(h, oom_findings(h)[1:], {}) for h in ("lab01", "lab02")]
    [summary] = [s for s in fleet_sections(results, fold=True) if s["title"].startswith("diagnose")]
    assert "next" not in summary["columns"], summary
    assert "{host}" not in str(summary["rows"]), summary


# ---------------------------------------------------------------- short by default
def verify_result(host: str, failing: int = 0, total: int = 18) -> Result:
    items = []
    for n in range(total):
        ok = n >= failing
        items.append(
            Item(
                f"check-{n} [grep]",
                Status.OK if ok else Status.FAILED,
                f"/pattern-{n}/ {'found at line 1' if ok else 'not found in gen.py'}",
                {
                    "evidence": [{"line": 1, "text": f"code {n}"}],
                    "proves": "the file has the text",
                    "cannot": "that it runs",
                },
            )
        )
    status = Status.OK if not failing else Status.FAILED
    return Result(
        host,
        "verify",
        status,
        f"{total - failing}/{total} checks passed",
        items,
        evidence=None if not failing else Evidence("python -c '<fleetops bootstrap>'", 0, [], 1.2),
    )


def test_a_host_whose_checks_all_pass_prints_one_line():
    rep, out = reporter(["lab01"])
    r = verify_result("lab01")
    rep.result(r)
    assert out.getvalue().splitlines() == ["lab01 | verify | ok | 18/18 checks passed"]


def test_one_healthy_host_fits_in_five_lines_with_its_summary():
    rep, out = reporter(["lab01"])
    rep.live_start(["lab01"])  # not a terminal: no live view, the run's clock only
    r = verify_result("lab01")
    rep.result(r)
    rep.finish([r], 0)
    lines = out.getvalue().rstrip("\n").splitlines()
    assert len(lines) <= 5, lines
    assert "RECAP" not in out.getvalue()  # one host: its own line already says what the recap would
    assert re.fullmatch(
        r"1 host: 1 ok, 0 changed, 0 failed, 0 unreachable in \d+\.\d s", lines[-1]
    ), lines


def test_a_failing_host_prints_its_failures_only_and_verbose_the_rest():
    rep, out = reporter(["lab01"])
    rep.result(verify_result("lab01", failing=2))
    text = out.getvalue()
    assert "check-0 [grep]" in text and "check-1 [grep]" in text
    assert "check-2 [grep]" not in text and "found at line 1" not in text, text
    assert "16 passed" in text and "-v" in text, text  # says what it left out and how to see it
    # the agent exited 0: the failures are in the checks, not the call
    assert "<fleetops bootstrap>" not in text
    loud, out = reporter(["lab01"], verbose=True)
    loud.result(verify_result("lab01", failing=2))
    text = out.getvalue()
    assert all(f"check-{n} [grep]" in text for n in range(18)), text


def test_folding_starts_at_two_hosts():
    assert fold.FOLD_MIN_HOSTS == 2


# ---------------------------------------------------------------- order
def test_recap_and_facts_list_hosts_in_host_order_not_finish_order():
    finished = ["lab10", "lab02", "lab03", "lab01"]
    results = [
        Result(h, "facts", Status.OK, "facts", payload=Facts({}, ["Debian", h, *["x"] * 9]))
        for h in finished
    ]
    rep, out = reporter(finished)
    rep.finish(results, 0, sections=fleet_sections(results))
    text = out.getvalue()
    recap = text[text.index("RECAP") :]
    assert [m for m in re.findall(r"^(lab\d+) ", recap, re.M)] == [
        "lab01",
        "lab02",
        "lab03",
        "lab10",
    ], recap
    [facts] = fleet_sections(results)
    assert facts["columns"][1:] == ["lab01", "lab02", "lab03", "lab10"], facts["columns"]


# ---------------------------------------------------------------- tail: the bar, not the raw line
# as well
def test_a_progress_line_goes_to_the_bar_on_a_terminal_not_printed_as_well():
    rep, out = reporter(["lab01"], width=120, terminal=True)
    rep.live_start(["lab01"])
    try:
        assert rep.live is not None
        rep.job_attached("lab01", IDS[0], "running")
        rep.job_line(
            "lab01",
            "progress samples=8/64 tok/s=250.0 eta=73.5s",
            False,
            {"done": 8, "total": 64, "tok_s": 250.0, "eta": 73.5},
        )
        rep.job_line("lab01", "loading weights", False, None)
    finally:
        rep.live_stop()
    text = ANSI.sub("", out.getvalue())
    assert "loading weights" in text
    assert "lab01 | progress samples=8/64" not in text, text


# ---------------------------------------------------------------- the live view leaves nothing
# behind
def test_a_message_to_stderr_while_the_live_view_is_up_goes_above_it_not_onto_it(monkeypatch):
    """rich's live view puts a proxy in sys.stderr that prints above the view; a console that wrote
    past it (rich looks through a wrapper for the proxied file) put the line straight onto the view,
    which could then not be erased whole: the view stayed, glued to the output."""
    raw = io.StringIO()
    raw.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stderr", raw)
    rep, out = reporter(["lab01"], width=120, terminal=True)
    rep.live_start(["lab01"])
    try:
        assert rep.live is not None
        rep.interrupted()
        rep.error("the audit log is full")
    finally:
        rep.live_stop()
    assert "Ctrl-C" not in raw.getvalue() and "audit log" not in raw.getvalue(), raw.getvalue()
    shown_above = ANSI.sub("", out.getvalue())
    assert (
        "Ctrl-C: starting nothing new" in shown_above
        and "error: the audit log is full" in shown_above
    )


def test_the_live_view_leaves_the_last_columns_free_for_what_the_terminal_echoes():
    """A view line as wide as the terminal becomes two lines when the terminal echoes `^C` after it,
    and the view is erased by counting its lines: its top stayed behind."""
    from fleetops.report.console import LIVE_MARGIN
    from fleetops.report.liveview import _Fresh

    rep, _ = reporter(["lab01", "lab02"], width=80, terminal=True)
    rep.live_start(["lab01", "lab02"])
    try:
        rep.job_attached("lab01", IDS[0], "running")
        rep.job_line("lab01", "x", False, {"done": 1, "total": 64, "tok_s": 9.0, "eta": 99.0})
        out = io.StringIO()
        Console(file=out, width=80, soft_wrap=True).print(_Fresh(rep._live_table))
    finally:
        rep.live_stop()
    widths = [len(line.rstrip("\n")) for line in out.getvalue().splitlines()]
    assert max(widths) <= 80 - LIVE_MARGIN, (widths, out.getvalue())
    # the id whole, once
    assert IDS[0] in out.getvalue() and "…" not in out.getvalue(), out.getvalue()


def test_a_wait_piped_is_a_line_per_change_and_on_a_terminal_the_hosts_live_row():
    rep, out = reporter(["lab01"])
    rep.live_start(["lab01"])  # not a terminal: no live view
    for left, what in (
        (600, "0/2 free; 2 busy"),
        (599, "0/2 free; 2 busy"),
        (598, "0/2 free; 2 busy"),
        (420, "1/2 free; 1 busy"),
        (419, "1/2 free; 1 busy"),
    ):
        rep.waiting("lab01", "gpu", what, left)
    assert out.getvalue().splitlines() == [
        "lab01 | gpu | waiting up to 600s: 0/2 free; 2 busy",
        "lab01 | gpu | waiting: 1/2 free; 1 busy (420s left)",
    ]
    live, out = reporter(["lab01"], width=120, terminal=True)
    live.live_start(["lab01"])
    try:
        for left in (600, 599, 598):
            live.waiting("lab01", "gpu", "0/2 free; 2 busy", left)
        assert live.rows["lab01"]["task"] == "gpu waiting 598s more: 0/2 free; 2 busy"
    finally:
        live.live_stop()
    # nothing printed: the row says it
    assert "lab01 | gpu | waiting" not in ANSI.sub("", out.getvalue())
