"""The on-call pieces that need no lab: the ssh-config text (quoting, refusals, example hosts left
out), the local names `fetch` accepts from a node, and the plain (piped) progress lines."""

from __future__ import annotations

import io
from pathlib import Path, PurePosixPath

import paramiko
import pytest
from rich.console import Console

from fleetops.plans.inventory import load_inventory
from fleetops.plans.localpath import UnsafeName, safe_join_relative
from fleetops.plans.sshconfig_out import host_params, render
from fleetops.plans.yamlsrc import ConfigError
from fleetops.report.oncall import TransferBoard


def inventory(tmp_path: Path, body: str):
    (tmp_path / "hosts.yaml").write_text(body)
    return load_inventory(tmp_path / "hosts.yaml")


def test_render_quotes_blanks_and_paramiko_reads_every_value_back(tmp_path):
    inv = inventory(
        tmp_path,
        "hosts:\n  gpu01:\n    address: 10.0.0.5\n    port: 2222\n    user: ops\n"
        "    identity_file: /keys/my key\n    known_hosts: /kh/known hosts\n    jump: bastion\n"
        "    groups: [gpu]\n  bastion:\n    address: 10.0.0.1\n",
    )
    text = render(inv)
    assert '    IdentityFile "/keys/my key"' in text and "# groups: gpu\nHost gpu01" in text
    config = paramiko.SSHConfig.from_text(text)
    for name, host in inv.hosts.items():
        got = config.lookup(name)
        want = host_params(host)
        assert {k: got[k] if k != "identityfile" else got[k][0] for k in want} == want
    assert "identityfile" not in host_params(inv.hosts["bastion"])


@pytest.mark.parametrize("bad", ['/keys/a"b', "/keys/%h"])
def test_render_refuses_values_openssh_would_read_differently(tmp_path, bad):
    inv = inventory(
        tmp_path, f"hosts:\n  gpu01:\n    address: 10.0.0.5\n    identity_file: '{bad}'\n"
    )
    with pytest.raises(ConfigError, match=r"hosts.yaml:\d+.*gpu01: IdentityFile"):
        render(inv)


def test_example_hosts_are_left_out(tmp_path):
    inv = inventory(tmp_path, "example: true\nhosts:\n  gpu01:\n    address: 10.0.0.5\n")
    text = render(inv)
    assert (
        "Host gpu01" not in text and "left out (example inventory, never contacted): gpu01" in text
    )


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "", "a//b", "./a"])
def test_fetch_never_writes_where_a_node_says_outside_its_folder(name):
    with pytest.raises(UnsafeName):
        safe_join_relative(PurePosixPath("fetched/lab01"), name)


def test_fetch_accepts_plain_relative_names():
    joined = safe_join_relative(PurePosixPath("fetched/lab01"), "job-1/output.log")
    assert str(joined) == "fetched/lab01/job-1/output.log"


def test_piped_progress_is_a_line_at_each_quarter_and_starts_past_a_resumed_part():
    out = io.StringIO()
    board = TransferBoard(Console(file=out, force_terminal=False, width=200), quiet=False)
    transfer = board.start("lab01 big.bin", 100 << 20, 30 << 20)
    for done in range(0, 71 << 20, 1 << 20):
        transfer(done)
    transfer.finish()
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == ["50%", "75%"], lines


def test_terminal_gets_one_shared_bar_display_for_large_files_only():
    out = io.StringIO()
    board = TransferBoard(Console(file=out, force_terminal=True, width=120), quiet=False)
    small = board.start("lab01 small", 1 << 20, 0)
    assert board.progress is None  # a 1 MiB file comes and goes too fast for a bar
    first, second = board.start("lab01 big", 100 << 20, 0), board.start("lab02 big", 100 << 20, 0)
    # parallel hosts share one display
    assert board.progress is not None and len(board.progress.tasks) == 2
    first(50 << 20)
    assert board.progress.tasks[0].completed == 50 << 20
    for transfer in (small, first, second):
        transfer.finish()
    assert board.progress is None and "lab02 big" in out.getvalue()
    # --json: nothing drawn
    quiet = TransferBoard(Console(file=io.StringIO(), force_terminal=True), quiet=True)
    quiet.start("lab01 big", 100 << 20, 0)(60 << 20)
    assert quiet.progress is None and quiet.console.file.getvalue() == ""


def test_a_zombie_of_an_ended_job_is_not_a_process_it_left_behind():
    # Seen right after an OOM kill: the job ended, its exited wrapper not yet reaped (state Z).
    # diagnose said "ended (killed) but left 1 process ... Z" and sent the operator to `stop`, which
    # can do nothing about it.
    from fleetops.tasks.diagnose import process_findings

    job = {"id": "j1", "state": "killed", "wrapper_pid": 10, "pgid": 10}
    zombie = {"pid": 11, "state": "Z", "cpu_pct": 0.0, "rss_kb": 0, "comm": "python"}
    assert process_findings("lab01", job, [zombie]) == []
    live = {**zombie, "pid": 12, "state": "S"}
    found = process_findings("lab01", job, [zombie, live])
    assert (
        len(found) == 1 and found[0].verdict == "WARN" and "left 1 process: 12 S" in found[0].msg
    ), found
    running = process_findings("lab01", {**job, "state": "running"}, [zombie])
    # a zombie in a running job is still worth a look
    assert running and running[0].verdict == "WARN"
