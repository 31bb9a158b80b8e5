"""A thousand hosts from one process, pure parts: the folded `verify` report of 1,003 hosts fits one
screen, the fan-out respects the open-file limit (and says so when it lowers it), the large lab's
host venvs hold what the playbook reads. No sshd: the limits are tried in a child process (a lowered
hard limit cannot be raised)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from fleetops.lab.scale import LISTEN_PER_SSHD, address, playbook_files
from fleetops.report.console import Reporter
from fleetops.report.fold import identities
from fleetops.results import Evidence, Item, Result, Status

REPO = Path(__file__).resolve().parent.parent
CHECKS = [f"marker-{n}" for n in range(11)]


def verify(host: str, odd: str = "") -> Result:
    """A grep-only `verify` answer, with the host's own path in each message (as a real one has)."""
    if odd == "down":
        return Result(
            host,
            "verify",
            Status.UNREACHABLE,
            f"{host}: connection refused; is sshd running?",
            evidence=Evidence(f"ssh {host}", None, ["Connection refused"], 0.01),
        )
    items = [
        Item(
            name,
            Status.FAILED if odd == "drift" and n == 3 else Status.OK,
            "not found"
            if odd == "drift" and n == 3
            else f"found at line {100 + n} of /srv/{host}/gen.py",
            {"proves": "the text is there", "cannot": "runtime behaviour"},
        )
        for n, name in enumerate(CHECKS)
    ]
    failed = odd == "drift"
    return Result(
        host,
        "verify",
        Status.FAILED if failed else Status.OK,
        f"{len(items)} checks on {host}: {'1 failed' if failed else 'all passed'}",
        items=items,
    )


def render(results: list[Result], width: int = 80) -> str:
    out = io.StringIO()
    rep = Reporter(console=Console(file=out, width=width, highlight=False, soft_wrap=True))
    rep.who = identities(
        (r.host, f"10.1.{i // 250}.{i % 250 + 1}", 22) for i, r in enumerate(results)
    )
    rep.fold = True
    rep.live_start([r.host for r in results])
    for r in results:
        rep.result(r)
    rep.finish(results, 1, rerun="fab -H 'gpu[0007,0501,0901]' verify")
    return out.getvalue()


def screen_rows(text: str, width: int) -> int:
    """Rows the text takes on a terminal `width` columns wide, which wraps a longer line."""
    return sum(max(1, -(-len(line) // width)) for line in text.splitlines())


def test_a_thousand_identical_hosts_and_three_odd_ones_fit_one_screen():
    names = [f"gpu{i:04d}" for i in range(1, 1004)]
    odd = {"gpu0007": "drift", "gpu0501": "down", "gpu0901": "drift"}
    text = render([verify(h, odd.get(h, "")) for h in names])
    assert screen_rows(text, 80) <= 40, text
    assert "(1000)" in text and "gpu[0007,0901] (2)" in text and "gpu0501" in text
    assert "1003 hosts: 1000 ok, 0 changed, 2 failed, 1 unreachable" in text
    assert "failed hosts: gpu[0007,0501,0901]" in text


def test_the_folded_report_does_not_grow_with_the_fleet():
    small = render([verify(f"gpu{i:04d}", "drift" if i == 7 else "") for i in range(1, 11)])
    large = render([verify(f"gpu{i:04d}", "drift" if i == 7 else "") for i in range(1, 1001)])
    # a longer range wraps once more, at most
    assert screen_rows(large, 80) <= screen_rows(small, 80) + 3


def limited(code: str, soft: int, hard: int) -> dict:
    """`code` run in a child whose open-file limit is (soft, hard); it prints one JSON value."""
    prog = (
        "import json, resource\nresource.setrlimit(resource.RLIMIT_NOFILE, "
        f"({soft}, {hard}))\n{code}"
    )
    proc = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


BOUND = (
    "from fleetops.wire.connector import FDS_KEPT, FDS_PER_HOST, fork_bound, open_fds\n"
    "n, why = fork_bound({wanted})\n"
    "print(json.dumps({{'n': n, 'why': why, 'soft': resource.getrlimit(resource.RLIMIT_NOFILE)[0], "
    "'fit': open_fds() + FDS_KEPT + n * FDS_PER_HOST}}))"
)


def test_the_fan_out_is_lowered_to_fit_256_open_files_and_says_so():
    got = limited(BOUND.format(wanted=1000), 256, 256)
    assert 1 <= got["n"] < 1000 and got["fit"] <= 256
    assert (
        got["why"].startswith(f"forks lowered from 1000 to {got['n']}: ")
        and "ulimit -n" in got["why"]
    )


def test_a_fan_out_that_fits_is_left_alone():
    got = limited(BOUND.format(wanted=32), 256, 256)
    assert got == {**got, "n": 32, "why": None}


def test_the_soft_limit_is_raised_towards_the_hard_one_first():
    got = limited(BOUND.format(wanted=1000), 256, 8192)
    assert (
        got["n"] == 1000
        and got["why"] is None
        and 256 < got["soft"] <= 8192
        and got["fit"] <= got["soft"]
    )


def test_hosts_through_the_system_ssh_are_budgeted_their_pipes():
    """An openssh host at work holds its ssh child's pipes (and more while one starts): budgeted
    as paramiko's one socket, 256 hosts under `ulimit -n 256` ran out of descriptors ("Too many
    open files") with the fan-out lowered to 52."""
    from fleetops.plans.inventory import Host
    from fleetops.wire.connector import FDS_PER_HOST, FDS_PER_HOST_OPENSSH
    from fleetops.wire.transports import fds_per_host

    plain, ssh = Host(name="a", address="a"), Host(name="b", address="b", transport="openssh")
    assert fds_per_host([plain]) == FDS_PER_HOST < FDS_PER_HOST_OPENSSH
    assert fds_per_host([plain, ssh]) == FDS_PER_HOST_OPENSSH
    assert fds_per_host([plain], "openssh") == FDS_PER_HOST_OPENSSH
    code = (
        "from fleetops.wire.connector import FDS_KEPT, FDS_PER_HOST_OPENSSH as P, fork_bound,"
        " open_fds\nn, why = fork_bound(256, P)\n"
        "print(json.dumps({'n': n, 'why': why, 'fit': open_fds() + FDS_KEPT + n * P}))"
    )
    got = limited(code, 256, 256)
    assert (
        got["fit"] <= 256
        and f"each host at work holds up to {FDS_PER_HOST_OPENSSH}" in (got["why"])
    )


def test_each_sshd_listens_on_at_most_openssh_s_limit_and_addresses_are_distinct_loopback():
    addresses = [address(i) for i in range(1000)]
    assert len(set(addresses)) == 1000 and all(a.startswith("127.") for a in addresses)
    assert all(0 < int(a.rsplit(".", 1)[1]) < 255 for a in addresses)
    assert LISTEN_PER_SSHD == 16


def test_a_scale_host_holds_the_files_the_playbook_patches_and_greps():
    files = playbook_files()
    assert "speculators/data_generation/vllm_hidden_states_generator.py" in files
    assert "speculators/data_generation/custom_worker.py" in files
    assert {"speculators/__init__.py", "speculators/data_generation/__init__.py"} <= set(files)
