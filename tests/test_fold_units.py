"""Folding, pure parts: host ranges (plans/hostrange.py), folding and odd ones out (report/fold.py),
the closing lines and the live view at scale (report/console.py), the re-run command (run.py). No
sshd."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from fleetops.plans import hostrange
from fleetops.plans.inventory import Host, Inventory, UnknownHost
from fleetops.report import fold
from fleetops.report.console import Reporter
from fleetops.results import Evidence, Item, Result, Status
from fleetops.results.adhoc import CommandOutput
from fleetops.run import _with_failed, rerun_command


# ---------------------------------------------------------------- host ranges
def test_fold_writes_the_compact_notation():
    assert hostrange.fold(["lab01", "lab02", "lab03", "lab07"]) == "lab[01-03,07]"
    assert hostrange.fold([f"gpu{i:02d}" for i in range(1, 33)]) == "gpu[01-32]"
    # padding carries over 09 → 10
    assert hostrange.fold(["lab08", "lab09", "lab10"]) == "lab[08-10]"
    assert hostrange.fold(["b2", "a1", "b10", "x"]) == "a1,b[2,10],x"
    assert hostrange.fold(["lab07"]) == "lab07"
    assert hostrange.header(["lab07"]) == "lab07"
    assert hostrange.header(["lab01", "lab02", "lab03", "lab07"]) == "lab[01-03,07] (4)"
    assert hostrange.fold(["n1.dc", "n2.dc"]) == "n[1-2].dc"


def test_expand_reads_it_back_and_keeps_globs_globs():
    assert hostrange.expand("lab[01-03,07]") == ["lab01", "lab02", "lab03", "lab07"]
    assert hostrange.expand("gpu[8-10]") == ["gpu8", "gpu9", "gpu10"]
    # fnmatch class
    assert hostrange.expand("gpu[12]") == ["gpu[12]"] and not hostrange.is_range("gpu[12]")
    assert hostrange.split_words("lab[01-03,07], gpu01,,@lab") == ["lab[01-03,07]", "gpu01", "@lab"]
    with pytest.raises(hostrange.RangeError, match="goes downwards"):
        hostrange.expand("lab[05-03]")
    with pytest.raises(hostrange.RangeError, match="more than"):
        hostrange.expand("gpu[1-99999999]")


@given(
    st.sets(st.integers(0, 300), min_size=1, max_size=40),
    st.sampled_from([0, 2, 3]),
    st.sampled_from(["gpu", "node-a", "n"]),
)
def test_fold_then_expand_gives_the_same_hosts(numbers, width, prefix):
    names = [f"{prefix}{n:0{width}d}" for n in numbers]
    back = [
        n for word in hostrange.split_words(hostrange.fold(names)) for n in hostrange.expand(word)
    ]
    assert sorted(back) == sorted(names)


def inventory(n: int = 12) -> Inventory:
    inv = Inventory(ssh_aliases=frozenset())
    for i in range(1, n + 1):
        inv.hosts[f"lab{i:02d}"] = Host(f"lab{i:02d}", "127.0.0.1", 2200 + i, groups=("lab",))
    return inv


def test_inventory_takes_ranges_in_hosts_and_limit():
    inv = inventory()
    assert [h.name for h in inv.expand(["lab[01-03,07]"])] == ["lab01", "lab02", "lab03", "lab07"]
    assert [h.name for h in inv.expand(["lab[11-12],lab01"])] == ["lab11", "lab12", "lab01"]
    assert [h.name for h in inv.limit(inv.expand(["@lab"]), "lab[01-08],!lab[02-07]")] == [
        "lab01",
        "lab08",
    ]
    with pytest.raises(UnknownHost, match="lab13"):
        inv.expand(["lab[12-13]"])


def test_at_failed_reads_the_first_line_of_last_failed(tmp_path: Path):
    (tmp_path / ".fleetops").mkdir()
    (tmp_path / ".fleetops" / "last-failed").write_text(
        "lab[05,11]\n# exit status 1; re-run: fab ...\n"
    )
    assert _with_failed(tmp_path, ["@failed", "lab01"]) == ["lab[05,11]", "lab01"]
    assert _with_failed(tmp_path, ["!@failed"]) == ["!lab[05,11]"]
    (tmp_path / ".fleetops" / "last-failed").unlink()
    with pytest.raises(UnknownHost, match="last-failed does not exist"):
        _with_failed(tmp_path, ["@failed"])


def test_rerun_command_names_the_failed_hosts_and_drops_limit():
    argv = ["/x/bin/fab", "-H", "@lab", "patch", "--limit", "lab0*", "verify"]
    assert rerun_command(argv, ["lab07", "lab19"]) == "fab -H 'lab[07,19]' patch verify"
    assert (
        rerun_command(["fleet", "--hosts=a,b", "--limit=a", "--", "uname", "-a"], ["b"])
        == "fleet -H b -- uname -a"
    )
    assert (
        rerun_command(
            ["/usr/lib/python3/fabric/__main__.py", "-Hlab01", "run", "echo 'a b'"], ["lab01"]
        )
        == "fab -H lab01 run 'echo '\"'\"'a b'\"'\"''"
    )
    assert rerun_command(["fab", "ping"], ["lab01"]) == "fab -H lab01 ping"


# ---------------------------------------------------------------- folding
def reporter(fold_on: bool, hosts: list[str]) -> tuple[Reporter, io.StringIO]:
    out = io.StringIO()
    rep = Reporter(console=Console(file=out, width=130, highlight=False, soft_wrap=True))
    rep.fold = fold_on
    rep.who = fold.identities((h, "10.0.0.%d" % i, 22) for i, h in enumerate(hosts, 1))
    rep.live_start(hosts)
    return rep, out


def verify_result(host: str, ok: bool = True, note: str = "") -> Result:
    status = Status.OK if ok else Status.FAILED
    items = [
        Item("compile data_generation", Status.OK, "compiled"),
        Item("grep eagle", status, "found" if ok else f"missing in /srv/{host}/eagle.py{note}"),
    ]
    return Result(
        host,
        "verify",
        status,
        f"2 checks on {host}",
        items=items,
        evidence=None if ok else Evidence("agent verify", 1, ["boom"], 0.5),
    )


def test_identical_results_fold_with_the_hosts_own_name_as_placeholder():
    hosts = [f"gpu{i:02d}" for i in range(1, 9)]
    rep, out = reporter(True, hosts)
    results = [verify_result(h, ok=h not in ("gpu03", "gpu07")) for h in hosts]
    for r in results:
        rep.result(r)
    assert out.getvalue() == ""  # nothing per host while folding: the groups come at the end
    rep.finish(results, 1)
    text = out.getvalue()
    assert "gpu[01-02,04-06,08] (6) | verify | ok | 2 checks on {host}" in text
    # the two failures differ only by their own name: one group, placeholder in the text
    assert "gpu[03,07] (2) | verify | failed | 2 checks on {host}" in text
    assert "missing in /srv/{host}/eagle.py" in text
    assert text.count("| verify |") == 2
    assert "failed hosts: gpu[03,07]  (exit status 1)" in text
    assert re.search(r"8 hosts: 6 ok, 0 changed, 2 failed, 0 unreachable in \d+\.\d s", text)


def test_address_folds_and_other_text_does_not():
    who = fold.identities(
        [
            ("a1", "10.0.0.1", 22),
            ("a2", "10.0.0.2", 22),
            ("b1", "127.0.0.1", 22),
            ("b2", "127.0.0.1", 22),
        ]
    )
    assert (
        who["a1"].replace("a1 at 10.0.0.1 and 10.0.0.1:22, a10, xa1")
        == "{host} at {addr} and {addr}, a10, xa1"
    )
    assert who["b1"].replace("127.0.0.1") == "127.0.0.1"  # shared by two hosts: nobody's own
    draw = Reporter().draw
    drawn = fold.draw_all(
        [
            Result("a1", "ping", Status.OK, "a1 ok"),
            Result("a2", "ping", Status.OK, "a2 ok"),
            Result("b1", "ping", Status.OK, "b1 ok, but b2 said hi"),
        ],
        draw,
        who,
    )
    groups = fold.group(drawn)
    assert [g.hosts for g in groups] == [["a1", "a2"], ["b1"]]


def test_run_output_and_exit_code_are_part_of_the_identity():
    def run(host: str, out: str, code: int = 0) -> Result:
        return Result(
            host,
            "run",
            Status.OK if code == 0 else Status.FAILED,
            f"'x': exit {code}",
            payload=CommandOutput("x", code, out, "", False, 0, 0),
        )

    results = [
        run("n1", "same\n"),
        run("n2", "same\n"),
        run("n3", "other\n"),
        run("n4", "same\n", 0),
    ]
    groups = fold.group(
        fold.draw_all(
            results, Reporter().draw, fold.identities((h, h, 22) for h in ("n1", "n2", "n3", "n4"))
        )
    )
    assert [g.hosts for g in groups] == [["n1", "n2", "n4"], ["n3"]]
    ((_, minority, diff),) = fold.odd_ones_out(groups)
    assert minority.hosts == ["n3"]
    assert [x for x in diff if x.startswith(("+", "-")) and x[:3] not in ("---", "+++")] == [
        "-{host} | same",
        "+{host} | other",
    ]
    assert diff[:2] == ["--- n[1-2,4] (3)", "+++ n3"]


def test_odd_ones_out_says_when_all_agree():
    results = [Result(h, "ping", Status.OK, "agent 1.0") for h in ("a", "b")]
    ((task, minority, lines),) = fold.odd_ones_out(
        fold.group(fold.draw_all(results, Reporter().draw, {}))
    )
    assert (task, minority, lines) == ("ping", None, ["ping: all 2 hosts answered the same"])


def test_few_hosts_print_as_before_with_the_summary_line():
    rep, out = reporter(False, ["lab01"])
    r = verify_result("lab01", ok=False)
    rep.result(r)
    rep.finish([r], 1, rerun="fab -H lab01 verify")
    lines = out.getvalue().splitlines()
    assert lines[:6] == [
        "lab01 | verify | failed | 2 checks on lab01",
        "    failed  grep eagle: missing in /srv/lab01/eagle.py",
        "    1 passed, not shown: -v shows them",
        "    command: agent verify  exit: 1  took: 0.5s",
        "    stderr (last lines):",
        "      boom",
    ]
    assert lines[-3] == "failed hosts: lab01  (exit status 1)"
    assert re.fullmatch(r"1 host: 0 ok, 0 changed, 1 failed, 0 unreachable in \d+\.\d s", lines[-2])
    assert lines[-1] == "re-run the failed hosts: fab -H lab01 verify"


def test_summary_counts_each_host_once_by_its_worst_outcome():
    results = [
        Result("a", "patch", Status.CHANGED, ""),
        Result("a", "verify", Status.OK, ""),
        Result("b", "patch", Status.FAILED, ""),
        Result("b", "verify", Status.SKIPPED, ""),
        Result("c", "ping", Status.UNREACHABLE, ""),
        Result("d", "ping", Status.SKIPPED, ""),
    ]
    assert (
        fold.summary_line(results, 4.06)
        == "4 hosts: 0 ok, 1 changed, 1 failed, 1 unreachable, 1 skipped in 4.1 s"
    )


def test_recap_folds_hosts_with_the_same_counts():
    recap = {
        f"n{i}": {"ok": 2, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0}
        for i in range(1, 6)
    }
    recap["n3"] = {"ok": 1, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 0}
    assert [h for h, _ in fold.recap_groups(recap)] == ["n3", "n[1-2,4-5] (4)"]


def test_live_view_at_scale_shows_counts_and_the_slowest_not_every_host():
    hosts = [f"gpu{i:03d}" for i in range(1, 129)]
    rep, _ = reporter(True, hosts)
    for h in hosts[:40]:
        rep.task_started(h, "verify")
    for h in hosts[:30]:
        rep.result(verify_result(h, ok=h != "gpu007"))
    screen = io.StringIO()
    Console(file=screen, width=130).print(rep._live_table())
    text = screen.getvalue()
    assert "128 hosts" in text and "88 queued" in text and "10 running" in text and "29 ok" in text
    assert "1 failed" in text and "failed so far: gpu007" in text
    # five slowest and the failed one, not 128 rows
    assert "slowest:" in text and text.count("gpu0") <= 6
    few, _ = reporter(False, ["lab01", "lab02"])
    table = io.StringIO()
    Console(file=table, width=130).print(few._live_table())
    # a few hosts keep their rows
    assert "lab01" in table.getvalue() and "lab02" in table.getvalue()


def test_no_fold_and_odd_are_run_options_of_every_task():
    from fleetops.fab.decorators import RUN_OPTIONS

    # `--fold` was the default
    assert RUN_OPTIONS["no_fold"][0] is False and "fold" not in RUN_OPTIONS
    # --diff is patch's and rollback's own
    assert RUN_OPTIONS["odd"][0] is False and "diff" not in RUN_OPTIONS


def test_durations_do_not_split_groups_and_show_as_a_range():
    results = [
        Result(
            h,
            "verify",
            Status.OK,
            "1/1 checks passed",
            items=[
                Item("imports", Status.OK, f"import x ok ({t}s; proves only that the module loads)")
            ],
        )
        for h, t in (("n1", 1.59), ("n2", 0.04), ("n3", 0.8))
    ]
    # -v: the ok items shown
    (g,) = fold.group(fold.draw_all(results, Reporter(verbose=True).draw, {}))
    assert g.hosts == ["n1", "n2", "n3"]
    assert "import x ok (0.04-1.59s; proves only" in fold.plain(g.lines()[1], "")


def test_last_failed_is_kept_by_unrelated_runs_and_emptied_by_successful_reruns(tmp_path: Path):
    from fleetops.run import _write_last_failed

    path = tmp_path / ".fleetops" / "last-failed"
    _write_last_failed(
        tmp_path,
        ["lab05", "lab11", "lab07"],
        "fab -H 'lab[05,07,11]' verify",
        1,
        ["lab01", "lab05"],
    )
    assert path.read_text().splitlines() == [
        "lab[05,07,11]",
        "# exit status 1; re-run: fab -H 'lab[05,07,11]' verify",
    ]
    # other hosts, all fine: untouched
    _write_last_failed(tmp_path, [], None, 0, ["lab01", "lab02"])
    assert path.read_text().splitlines()[0] == "lab[05,07,11]"
    _write_last_failed(tmp_path, [], None, 0, ["lab05", "lab07"])  # two of them fixed
    assert path.read_text().splitlines()[0] == "lab11"
    _write_last_failed(tmp_path, [], None, 0, ["lab11"])
    assert not path.exists()


def test_diagnose_fleet_summary_is_worst_first_and_folds_by_finding():
    from fleetops.report.rows import fleet_sections
    from fleetops.results import Severity
    from fleetops.results.diagnose import Diagnosis, SummaryRow

    def diag(host: str, verdict: str, area: str, msg: str) -> Result:
        status = Status.OK if verdict in ("OK", "WARN") else Status.FAILED
        row = SummaryRow(host, Severity(verdict), area, msg, f"fab -H {host} {area}")
        return Result(host, "diagnose", status, msg, payload=Diagnosis(Severity(verdict), [], row))

    results = [
        diag("lab01", "OK", "-", "-"),
        diag("lab02", "CRITICAL", "xid", "Xid 79 on GPU 1"),
        diag("lab03", "WARN", "load", "load 9"),
        diag("lab04", "UNKNOWN", "gpu", "no nvidia-smi"),
    ]
    [plain] = [s for s in fleet_sections(results) if s["title"].startswith("diagnose")]
    assert [row[:2] for row in plain["rows"]] == [
        ["lab02", "CRITICAL"],
        ["lab04", "UNKNOWN"],
        ["lab03", "WARN"],
        ["lab01", "OK"],
    ]
    same = [diag(h, "OK", "-", "-") for h in ("lab05", "lab06", "lab07")]
    [folded] = [
        s for s in fleet_sections(results + same, fold=True) if s["title"].startswith("diagnose")
    ]
    assert folded["columns"][0] == "hosts" and len(folded["rows"]) == 4, folded["rows"]
    # no command in a cell
    assert folded["rows"][-1] == ["lab[01,05-07] (4)", "OK", "-", "-"], folded["rows"]


def test_gpu_next_actions_print_once_per_folded_group():
    """Hosts whose gpu findings differ only by their own name fold into one group, and the
    group's next action (naming the group's hosts) is printed once, not once per host or per GPU."""
    from fleetops.plans.gpugate import Gate
    from fleetops.tasks.gpu import _interpret_gpu
    from fleetops.tasks.plan import Plan

    gpus = [
        {
            "index": i,
            "name": "NVIDIA H200",
            "uuid": f"GPU-{i}",
            "memory_used_mib": 0,
            "memory_total_mib": 143771,
            "memory_free_mib": 143771,
            "ecc_uncorrected": 0,
            "processes": [],
        }
        for i in range(2)
    ]
    # GPU 1 missing
    answers = {
        "lab01": {"ok": True, "gpus": gpus[:1]},
        "lab02": {"ok": True, "gpus": gpus[:1]},
        "lab03": {"ok": True, "gpus": gpus[:1]},
        "lab04": {"ok": False, "error_kind": "no_nvidia_smi", "error": "nvidia-smi not found"},
        "lab05": {"ok": False, "error_kind": "no_nvidia_smi", "error": "nvidia-smi not found"},
        "lab06": {"ok": True, "gpus": gpus},
    }
    plan = Plan("gpu", {}, 60, None, options={"gate": Gate(expected=2), "wait": 0.0})
    results = [_interpret_gpu(h, plan, a) for h, a in answers.items()]
    rep, out = reporter(True, list(answers))
    for r in results:
        rep.result(r)
    rep.finish(results, 11)
    text = out.getvalue()
    assert (
        "lab[01-03] (3) | gpu | failed | CRITICAL: 1/1 selected GPUs free; expected 2 GPUs, saw 1"
        in text
    ), text
    assert "lab[04-05] (2) | gpu | failed | UNKNOWN: nvidia-smi not found" in text, text
    assert "lab06 | gpu | ok | OK: 2/2 selected GPUs free" in text, text
    lines = [ln.strip() for ln in text.splitlines()]
    nexts = [(ln, lines[n + 1]) for n, ln in enumerate(lines) if ln.startswith("next:")]
    # Each group's command names the group's own hosts, as a range that -H reads back: it runs as
    # printed.
    assert nexts == [
        (
            "next: Xid events, ECC, row remapping; keep work off the node until it is fixed",
            "fab -H 'lab[01-03]' diagnose",
        ),
        (
            "next: is the NVIDIA driver installed, nvidia-smi on the login PATH?",
            "fab -H 'lab[04-05]' run 'command -v nvidia-smi'",
        ),
    ], text
    assert text.count("failed  GPU 1: missing") == 1  # the group's GPU line too, once
    # The group's table is titled for the group, not for whichever host's answer stands for it.
    assert (
        "lab[01-03] (3): GPUs" in text and "lab01: GPUs" not in text and "lab03: GPUs" not in text
    ), text
    assert "lab06: GPUs" in text, text


def _oracle(ident: fold.Identity, text: str) -> str:
    """The regex fold that the string search replaced (one compiled pattern per host): the string
    search must give the same text for any input."""
    alternatives = "|".join(re.escape(w) for w in sorted(set(ident.words()), key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9_.-])(?:{alternatives})(?![A-Za-z0-9_-]|\.[A-Za-z0-9])")
    return pattern.sub(
        lambda m: fold.PLACEHOLDER if m.group(0) == ident.name else fold.ADDRESS_PLACEHOLDER, text
    )


@given(
    st.lists(
        st.sampled_from(
            [
                "lab1",
                "lab10",
                "10.0.0.1",
                "10.0.0.1:22",
                ":22",
                ".",
                "-",
                "_",
                "x",
                " ",
                "/",
                ".yaml",
                "é",
                "1",
                "a.",
                "lab1lab1",
            ]
        ),
        max_size=12,
    )
)
def test_the_string_search_folds_exactly_as_the_regex_did(parts):
    text = "".join(parts)
    for ident in (
        fold.Identity("lab1", "10.0.0.1", 22, address_unique=True),
        fold.Identity("lab1", "10.0.0.1", 22),
        fold.Identity("10.0.0.1", "10.0.0.1", 22, address_unique=True),
    ):
        assert ident.replace(text) == _oracle(ident, text), (ident, text)


def test_a_line_that_does_not_name_its_host_comes_back_as_it_was():
    ident = fold.Identity("lab07", "10.0.0.7", 22, address_unique=True)
    line = "grep anchors: ok (2 of 2)"
    assert ident.replace(line) is line
    assert (
        ident.replace("lab07 at 10.0.0.7:22 (not lab070, x.lab07, lab07.yaml or 10.0.0.70); lab07.")
        == "{host} at {addr} (not lab070, x.lab07, lab07.yaml or 10.0.0.70); {host}."
    )
