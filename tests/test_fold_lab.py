"""Folding on a 12-node lab: folded output, odd ones out, host ranges, the closing lines, @failed.

Twelve real sshd nodes (module-scoped, this file's own). After `patch` every node answers `verify`
the same and the output is one block; then lab05 drifts (its patched file edited by hand) and lab09
reports another speculators version (its dist-info says 0.3.1; `fab lab.reset` restores it), and
each of them becomes its own group, which `--odd` shows as exactly their difference against the
majority."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import run_fab
from faultkit import playbook_patches, reset_node

from fleetops.lab import Lab
from fleetops.lab.common import site_packages

pytestmark = pytest.mark.lab

ALL = "lab[01-12]"
# The node's own python (the agent's parent of `sh -c`), asked for the installed speculators
# version.
VERSION_CMD = (
    "py=$(tr '\\0' '\\n' < /proc/$PPID/cmdline | head -n1); "
    '$py -c \'import importlib.metadata as m; print("speculators", m.version("speculators"))\''
)
NO_LIVE = {"FLEETOPS_NO_LIVE": "1", "FLEETOPS_FOLD": ""}
# The fast checks: twelve nodes running the import and probe checks at once take minutes on a small
# machine.
FAST = "--kinds=requires,grep,compile"


@pytest.fixture(scope="module")
def lab12(lab_factory):
    with lab_factory.own("fold", 12) as lab:
        yield lab


@pytest.fixture
def lab(lab12):
    for node in lab12.nodes():
        lab12.start_node(node)
        reset_node(lab12, node)
    (lab12.root / ".fleetops" / "last-failed").unlink(missing_ok=True)
    return lab12


def fab(lab: Lab, *args: str):
    return run_fab(lab.root, *args, env=NO_LIVE)


def result_lines(text: str) -> list[str]:
    """`<label> | <task> | <status> | ...` lines (a host or a folded group's header), before any
    diff."""
    head = text.split("\nodd ones out")[0]
    return [x for x in head.splitlines() if re.match(r"^\S+( \(\d+\))? \| [a-z]+ \| [a-z]+ \| ", x)]


def drift(lab: Lab, name: str) -> None:
    """Edit the patched generator on one node by hand, as an operator on that box would: prefix
    caching back on (the playbook's grep check `prefix-caching-off` looks for exactly that line)."""
    module = next(m for m, _ in playbook_patches() if m.endswith("vllm_hidden_states_generator"))
    path = lab.node(name).module_file(module)
    text = path.read_text()
    assert "enable_prefix_caching=False," in text
    path.write_text(text.replace("enable_prefix_caching=False,", "enable_prefix_caching=True,", 1))


def bump_version(lab: Lab, name: str, version: str = "0.3.1") -> None:
    """The node's speculators metadata says another version (the files stay 0.3.0's)."""
    dist = next(site_packages(lab.node(name).venv).glob("speculators-*.dist-info"))
    meta = dist / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta.read_text()))


def test_identical_answers_fold_into_one_block_with_a_range_header(lab):
    proc = fab(lab, "-H", ALL, "patch", "verify", FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = result_lines(proc.stdout)
    assert [x.split(" | ")[:3] for x in lines] == [
        ["lab[01-12] (12)", "patch", "changed"],
        ["lab[01-12] (12)", "verify", "ok"],
    ], proc.stdout
    assert not re.search(r"(?m)^lab\d\d \|", proc.stdout)  # no host printed on its own
    assert "12 hosts: 0 ok, 12 changed, 0 failed, 0 unreachable in " in proc.stdout
    assert "re-run" not in proc.stdout
    # the recap folds too: one row for the twelve
    assert re.search(r"(?m)^lab\[01-12\] \(12\)\s+│\s+1 │\s+1 │\s+0 │\s+0 │\s+0$", proc.stdout), (
        proc.stdout
    )
    # --no-fold: one block per host, as before
    plain = fab(lab, "-H", ALL, "verify", FAST, "--no-fold")
    assert sorted(x.split(" | ")[0] for x in result_lines(plain.stdout)) == [
        f"lab{i:02d}" for i in range(1, 13)
    ]


def test_two_different_nodes_are_their_own_groups_and_the_diff_is_exactly_their_difference(lab):
    assert fab(lab, "-H", ALL, "patch").returncode == 0
    drift(lab, "lab05")
    bump_version(lab, "lab09")
    proc = fab(lab, "-H", ALL, "run", VERSION_CMD, "--odd")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lab[01-08,10-12] (11) | speculators 0.3.0" in proc.stdout
    assert "lab09 | speculators 0.3.1" in proc.stdout
    odd = proc.stdout.split("odd ones out", 1)[1]
    changes = [
        x for x in odd.splitlines() if x.startswith(("+", "-")) and not x.startswith(("---", "+++"))
    ]
    assert changes == ["-{host} | speculators 0.3.0", "+{host} | speculators 0.3.1"], odd
    assert "--- lab[01-08,10-12] (11)" in odd and "+++ lab09" in odd

    # verify reads the files (and the version the package itself declares): lab09 agrees with the
    # majority, the drifted lab05 is the one odd node, and its diff is the drifted check and nothing
    # else.
    ver = fab(lab, "-H", ALL, "verify", FAST, "--odd")
    assert ver.returncode == 1, ver.stdout + ver.stderr
    headers = [x.split(" | ")[0] for x in result_lines(ver.stdout)]
    assert headers == ["lab[01-04,06-12] (11)", "lab05"], ver.stdout
    odd = ver.stdout.split("odd ones out", 1)[1].split("RECAP", 1)[0]
    assert "--- lab[01-04,06-12] (11)" in odd and "+++ lab05" in odd
    changed = [
        x for x in odd.splitlines() if x.startswith(("+", "-")) and not x.startswith(("---", "+++"))
    ]
    assert changed[:2] == [
        "-{host} | verify | ok | 14/14 checks passed",
        "+{host} | verify | failed | 13/14 checks passed",
    ], odd
    rest = changed[2:]
    assert any(x.startswith("+    failed  prefix-caching-off [grep]") for x in rest), odd
    # the rest: its check's evidence, the count of what passed, and its next: with lab05's own
    # commands
    assert all(
        "prefix-caching-off" in x
        or "line 172" in x
        or "proves:" in x
        or "13 passed, not shown" in x
        or "next:" in x
        or x.startswith("+      fab -H lab05 patch")
        for x in rest
    ), odd
    assert "+      fab -H lab05 patch --check" in rest and "{host} patch" not in odd, odd


def test_rerun_line_touches_only_the_failed_hosts_and_at_failed_reads_the_file(lab):
    assert fab(lab, "-H", ALL, "patch").returncode == 0
    drift(lab, "lab05")
    drift(lab, "lab11")
    proc = fab(lab, "-H", "@lab", "verify", FAST, "--limit", "lab[01-12]")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed hosts: lab[05,11]  (exit status 1)" in proc.stdout
    assert "12 hosts: 10 ok, 0 changed, 2 failed, 0 unreachable in " in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("re-run the failed hosts: "))
    command = line.removeprefix("re-run the failed hosts: ")
    # --limit dropped: the hosts are named exactly
    assert command == f"fab -H 'lab[05,11]' verify {FAST}", command
    saved = (lab.root / ".fleetops" / "last-failed").read_text().splitlines()
    assert saved[0] == "lab[05,11]" and command in saved[1]

    argv = shlex.split(command)
    assert argv[0] == "fab"
    again = fab(lab, *argv[1:])  # run as printed
    assert again.returncode == 1
    # alike
    assert [x.split(" | ")[0] for x in result_lines(again.stdout)] == ["lab[05,11] (2)"], (
        again.stdout
    )
    assert "2 hosts: 0 ok, 0 changed, 2 failed, 0 unreachable in " in again.stdout

    ping = fab(lab, "-H", "@failed", "ping")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert [x.split(" | ")[0] for x in result_lines(ping.stdout)] == ["lab[05,11] (2)"], ping.stdout
    assert not (lab.root / ".fleetops" / "last-failed").exists()  # that run failed nowhere
    gone = fab(lab, "-H", "@failed", "ping")
    assert gone.returncode == 2 and "@failed:" in gone.stderr and "Traceback" not in gone.stderr


def test_ranges_in_limit_and_two_hosts_alike_fold(lab):
    proc = fab(lab, "-H", "@lab", "ping", "--limit", "lab[02-03]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [x.split(" | ")[0] for x in result_lines(proc.stdout)] == ["lab[02-03] (2)"], proc.stdout
    alone = fab(lab, "-H", "@lab", "ping", "--limit", "lab[02-03]", "--no-fold")
    assert sorted(x.split(" | ")[0] for x in result_lines(alone.stdout)) == ["lab02", "lab03"], (
        alone.stdout
    )
    assert "2 hosts: 2 ok, 0 changed, 0 failed, 0 unreachable in " in proc.stdout
    bad = fab(lab, "-H", "lab[05-03]", "ping")
    assert bad.returncode == 2 and "goes downwards" in bad.stderr and "Traceback" not in bad.stderr
    unknown = fab(lab, "-H", "lab[11-13]", "ping")
    assert unknown.returncode == 2 and "lab13" in unknown.stderr
