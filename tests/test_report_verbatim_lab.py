"""What a node printed is shown as it printed it. The defect, found trying the ad-hoc form:

    $ fab -H lab01 -- echo "ok :thumbs_up: :warning: path/:smile:/x"
    lab01 | run | ok | 'echo ok 👍 ⚠ path/😄/x': exit 0
    lab01 | ok 👍 ⚠ path/😄/x

rich replaces `:name:` emoji codes in everything it prints unless told not to, and markup escaping
does not cover them: a log line, a path or a grep pattern holding `:warning:` reached the operator
changed (and the replacement cost every printed line a pass over its text, plus loading rich's emoji
table at the first one)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from conftest import REPO
from rich.console import Console

from fleetops.report.console import Reporter
from fleetops.results import Result, Status
from fleetops.results.adhoc import CommandOutput

CODES = "ok :thumbs_up: :warning: path/:smile:/x"


def test_an_adhoc_commands_output_with_emoji_codes_comes_back_verbatim(lab):
    script = os.path.join(os.path.dirname(sys.executable), "fleet")
    proc = subprocess.run(
        [script, "-H", "lab01", "--", "echo", CODES],
        cwd=lab.root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"lab01 | {CODES}" in proc.stdout, proc.stdout
    assert "👍" not in proc.stdout and "⚠" not in proc.stdout and "😄" not in proc.stdout


def test_results_errors_and_the_live_counts_print_emoji_codes_as_text(monkeypatch, capsys):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    rep = Reporter()  # the console fleetops makes for stdout, not one the test configures
    rep.started = None
    rep.result(
        Result(
            "lab01",
            "run",
            Status.FAILED,
            f"exit 1 {CODES}",
            payload=CommandOutput("x", 1, CODES, ":fire:", False, 0, 0),
        )
    )
    rep.error(f"lab01: {CODES}")
    rep.rows = {"gpu:smile:01": {"task": ":rocket:", "state": "failed", "started": None, "done": 0}}
    # whatever the console: the Text carries no emoji
    live = Console(file=io.StringIO(), width=200, emoji=True)
    live.print(rep._live_counts())
    printed, err = out.getvalue(), capsys.readouterr().err
    assert printed.count(CODES) == 2 and "lab01 ! :fire:" in printed, printed
    assert CODES in err, err
    assert "gpu:smile:01" in live.file.getvalue(), live.file.getvalue()
    for drawn in (printed, err, live.file.getvalue()):
        assert not {"👍", "⚠", "😄", "🔥"} & set(drawn), drawn


def test_a_fetch_progress_bar_names_the_file_as_it_is_named():
    """`fetch`'s bar on a terminal: its label (host and remote path) went through rich's markup and
    emoji pass."""
    from fleetops.report.oncall import TransferBoard

    out = io.StringIO()
    board = TransferBoard(Console(file=out, force_terminal=True, width=200), quiet=False)
    transfer = board.start("lab01 runs/:smile:/[big].bin", 100 << 20, 0)
    transfer(50 << 20)
    board.progress.refresh()
    transfer.finish()
    assert "runs/:smile:/[big].bin" in out.getvalue() and "😄" not in out.getvalue(), out.getvalue()
