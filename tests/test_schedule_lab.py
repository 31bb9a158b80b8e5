"""`fleet schedule` on real lab nodes: the node's crontab gets an entry (the lab nodes have no
systemd as init), and the exact line, run as cron runs it (a bare environment, /bin/sh -c), starts
the verified agent, writes the node's textfile for a real node_exporter, which a real Prometheus
scrapes (tests/promlab.py): a patched file edited by hand then fires the shipped drift alert. A
tampered agent zip, request or bootstrap makes the run refuse, say so in its log and leave no
metrics behind. The timer's unit files pass `systemd-analyze verify`."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from xml.etree import ElementTree

import promlab
import pytest
from conftest import GENERATOR, run_fab

from fleetops import audit
from fleetops.lab import Lab
from fleetops.lab.gpu import set_gpu_state
from remote_scripts.health import schedule as node_schedule

pytestmark = pytest.mark.lab
RULES = Path(str(files("fleetops") / "monitoring" / "fleetops.rules.yml"))
DASHBOARD = Path(str(files("fleetops") / "monitoring" / "fleetops.dashboard.json"))
RENDER = Path(__file__).resolve().parent.parent / "scripts" / "dashboard_svg.py"
TEXTFILE = "fleetops-verify-lab01.prom"


def crontab() -> list[str]:
    got = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    return got.stdout.splitlines() if got.returncode == 0 else []


def ours(lab: Lab) -> list[str]:
    keys = {node_schedule.key_of(str(node.state_dir), "verify") for node in lab.nodes()}
    return [
        line for line in crontab() if any(line.endswith(f"{node_schedule.MARK}{k}") for k in keys)
    ]


@pytest.fixture
def cron(lab: Lab):
    """The login user's crontab as it was, given back whatever the test left in it."""
    assert shutil.which("crontab"), "needs cron's crontab (scripts/setup installs Debian's cron)"
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    yield
    if before.returncode == 0:
        subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True, timeout=30)
    else:
        subprocess.run(["crontab", "-r"], capture_output=True, timeout=30)


def as_cron_runs(line: str) -> subprocess.CompletedProcess:
    """A crontab line's command, run as cron runs it: /bin/sh -c in cron's own bare environment."""
    command = line.split(None, 5)[5]
    env = {
        "HOME": os.path.expanduser("~"),
        "LOGNAME": os.environ.get("USER", "root"),
        "SHELL": "/bin/sh",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=600,
    )


def promtool_accepts(path: Path) -> None:
    checked = subprocess.run(
        [shutil.which("promtool") or "promtool", "check", "metrics"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def drift(lab: Lab) -> None:
    target = lab.node("lab01").module_file(GENERATOR)
    target.write_text(
        target.read_text().replace(
            "            kv_cache_groups=kv_cache_groups,\n",
            "            kv_cache_groups=groups,  # local edit\n",
        )
    )


def install(lab: Lab, textfiles: Path, *more: str) -> subprocess.CompletedProcess:
    return run_fab(
        lab.root,
        "-H",
        "lab01",
        "schedule",
        "verify",
        "--every",
        "15m",
        "--textfile-dir",
        str(textfiles),
        *more,
    )


def test_the_scheduled_line_run_as_cron_runs_it_feeds_prometheus_and_a_drift_fires_the_alert(
    lab: Lab, cron: None, tmp_path: Path
):
    assert promlab.available(), (
        "needs Debian's prometheus and prometheus-node-exporter (scripts/setup)"
    )
    assert run_fab(lab.root, "-H", "lab01", "patch").returncode == 0
    with promlab.Monitoring(tmp_path, RULES) as mon:
        dry = install(lab, mon.textfiles, "--check")
        assert dry.returncode == 0 and "would install verify in the crontab" in dry.stdout, (
            dry.stdout + dry.stderr
        )
        assert not ours(lab)  # check mode changed nothing
        done = install(lab, mon.textfiles)
        assert (
            done.returncode == 0 and "installed verify in the crontab, every 15 min" in done.stdout
        ), done.stdout + done.stderr
        [line] = ours(lab)
        assert line.startswith("*/15 * * * * "), line
        again = install(lab, mon.textfiles)
        assert (
            again.returncode == 0
            and "unchanged: already installed: the same command every 15 min" in again.stdout
        ), again.stdout + again.stderr
        assert ours(lab) == [line]

        first = as_cron_runs(line)
        assert first.returncode == 0, first.stdout + first.stderr
        textfile = mon.textfiles / TEXTFILE
        promtool_accepts(textfile)
        checks = mon.wait_until(
            "lab01's scheduled checks scraped", lambda: mon.query('fleetops_check_ok{host="lab01"}')
        )
        assert {r["value"][1] for r in checks} == {"1"} and len(checks) >= 8, checks
        assert mon.query('fleetops_patch_state{host="lab01",state="patched"} == 1')
        assert not [a for a in mon.alerts() if a["labels"]["alertname"] == "FleetopsPatchDrifted"]

        drift(lab)
        second = as_cron_runs(line)
        assert second.returncode == 0, second.stdout + second.stderr
        promtool_accepts(textfile)
        firing = mon.wait_until(
            "the drift alert firing",
            lambda: [
                a
                for a in mon.alerts()
                if a["labels"]["alertname"] == "FleetopsPatchDrifted" and a["state"] == "firing"
            ],
        )
        [alert] = firing
        assert alert["labels"]["host"] == "lab01" and alert["labels"]["file"] == GENERATOR, alert
        assert alert["annotations"]["next"] == "fleet -H lab01 patch --check", alert
        log = (lab.node("lab01").state_dir / "schedule" / "verify.log").read_text().splitlines()
        assert "lab01: files 1 drifted, 1 patched; 16/17 checks passed; wrote" in log[-1], log[-3:]

        listed = run_fab(lab.root, "-H", "lab01", "schedule", "--list")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert "installed: every 15 min via cron" in listed.stdout and "since" in listed.stdout, (
            listed.stdout
        )
        subprocess.run(
            ["crontab", "-"],
            input="".join(f"{x}\n" for x in crontab() if x != line),
            text=True,
            check=True,
            timeout=30,
        )  # someone takes the entry out by hand
        missing = run_fab(lab.root, "-H", "lab01", "schedule", "--list")
        assert missing.returncode == 1 and "verify: NOT installed any more" in missing.stdout, (
            missing.stdout
        )
        back = install(lab, mon.textfiles)
        assert back.returncode == 0 and "replaced verify in the crontab" in back.stdout, (
            back.stdout + back.stderr
        )
        assert ours(lab) == [line]
        removed = run_fab(lab.root, "-H", "lab01", "schedule", "--remove")
        assert (
            removed.returncode == 0
            and "removed the verify schedule: crontab entry" in removed.stdout
        ), removed.stdout + removed.stderr
        assert not ours(lab) and not textfile.exists()
        empty = run_fab(lab.root, "-H", "lab01", "schedule", "--list")
        assert empty.returncode == 0 and "no schedule installed" in empty.stdout, empty.stdout
        gone = run_fab(lab.root, "-H", "lab01", "schedule", "--remove")
        assert (
            gone.returncode == 0
            and "unchanged: no verify schedule is installed here" in gone.stdout
        ), gone.stdout
    lines = [
        json.loads(x)
        for x in audit.log_path(lab.root).read_text().splitlines()
        if '"schedule"' in x
    ]
    said = [(x.get("task"), x.get("result"), x.get("changed")) for x in lines[-6:]]
    assert ("schedule", "changed", True) in said and ("schedule", "ok", False) in said, said


@pytest.mark.parametrize("tamper", ["agent", "request", "bootstrap"])
def test_a_tampered_state_dir_makes_the_scheduled_run_refuse_and_leave_no_metrics(
    lab: Lab, cron: None, tmp_path: Path, tamper: str
):
    textfiles = tmp_path / "textfile"
    textfiles.mkdir(mode=0o755)
    done = install(lab, textfiles)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = ours(lab)
    assert as_cron_runs(line).returncode == 0
    textfile = textfiles / TEXTFILE
    # a good run's metrics, which must not outlive a refusal
    assert "fleetops_check_ok" in textfile.read_text()
    state = lab.node("lab01").state_dir
    command = line.split(None, 5)[5]
    target = {
        "agent": state / "bin" / Path(next(w for w in command.split() if w.endswith(".pyz"))).name,
        "request": state / "schedule" / "verify.request",
        "bootstrap": next((state / "schedule").glob("bootstrap-*.py")),
    }[tamper]
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n#")
        refused = as_cron_runs(line)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert not textfile.exists(), textfile.read_text()
        log = (state / "schedule" / "verify.log").read_text().splitlines()
        said = {
            "agent": "is not the agent fleetops sent",
            "request": "refusing to run",
            "bootstrap": "is not the bootstrap this schedule was installed with",
        }[tamper]
        assert said in log[-1], log[-3:]
    finally:
        target.write_bytes(original)
    assert as_cron_runs(line).returncode == 0 and textfile.exists()  # put back: it runs again


def test_the_timer_units_pass_systemd_analyze_verify(lab: Lab, tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "needs systemd-analyze (Debian's systemd package)"
    node = lab.node("lab01")
    state = str(node.state_dir)
    words = node_schedule.command_words(
        [
            str(node.python),
            "-I",
            "-S",
            "-c",
            "text",
            state,
            f"{state}/bin/fleetops-agent-x.pyz",
            "0" * 64,
        ],
        "bootstrap-x.py",
        "verify.request",
        "1" * 64,
    )
    for user in (False, True):
        folder = tmp_path / ("user" if user else "system")
        folder.mkdir()
        made = node_schedule.units(
            "verify", state, 900, words, f"{tmp_path}/fleetops-verify.prom", user
        )
        for name, text in made.items():
            (folder / name).write_text(text)
        checked = subprocess.run(
            [analyze, "verify", *(str(folder / n) for n in sorted(made))],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        service = next(t for n, t in made.items() if n.endswith(".service"))
        assert (
            "ExecStart=" in service
            and '"-I" "-S" "-c"' in service
            and "OnCalendar=*-*-* *:00/15:00"
            in next(t for n, t in made.items() if n.endswith(".timer"))
        )


def _children_cpu(run: Callable[[], subprocess.CompletedProcess]) -> float:
    """CPU seconds (user + system) of what `run` started and waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stdout + done.stderr
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_a_scheduled_run_costs_the_node_under_100ms_of_cpu_beyond_its_checks(
    lab: Lab, cron: None, tmp_path: Path
):
    """The same scheduled line with a request of no checks: what the schedule itself costs (the
    shell, the launcher, the bootstrap's trust checks, the agent's start, the textfile written),
    median of 10."""
    textfiles = tmp_path / "textfile"
    textfiles.mkdir(mode=0o755)
    assert install(lab, textfiles).returncode == 0
    [line] = ours(lab)
    folder = lab.node("lab01").state_dir / "schedule"
    stored = json.loads((folder / "verify.request").read_bytes())
    empty = (json.dumps({**stored, "requests": []}, sort_keys=True) + "\n").encode()
    (folder / "empty.request").write_bytes(empty)
    stored_sha = hashlib.sha256((folder / "verify.request").read_bytes()).hexdigest()
    assert f" verify.request {stored_sha} " in line
    bare = line.replace(
        f" verify.request {stored_sha} ", f" empty.request {hashlib.sha256(empty).hexdigest()} "
    )
    overhead = sorted(_children_cpu(lambda: as_cron_runs(bare)) for _ in range(10))
    assert (textfiles / TEXTFILE).read_text() == ""  # nothing checked, nothing claimed
    full = sorted(_children_cpu(lambda: as_cron_runs(line)) for _ in range(3))
    median = overhead[len(overhead) // 2]
    print(
        f"\nscheduled run, node CPU: no checks median {median * 1000:.0f} ms (min "
        f"{overhead[0] * 1000:.0f}, max {overhead[-1] * 1000:.0f}, n=10); the playbook's patch "
        f"--check and checks median {full[1] * 1000:.0f} ms (n=3)"
    )
    assert median < 0.100, overhead


def _renderer():
    spec = importlib.util.spec_from_file_location("dashboard_svg", RENDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboard_is_grafana_json_whose_queries_prometheus_runs_and_draws_from_real_scrapes(
    lab: Lab, cron: None, tmp_path: Path
):
    """Two nodes verify themselves (lab01 patched, lab02 not), `gpu --metrics` adds the GPUs;
    lab01's patched file is edited by hand, then put right. Every query of the dashboard runs on the
    real Prometheus over that window, and the picture is drawn from what it returned
    (FLEETOPS_DASHBOARD_SVG=PATH keeps it)."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) == 3
    for panel in panels:
        assert panel["type"] == "timeseries" and set(panel["gridPos"]) == {"x", "y", "w", "h"}, (
            panel
        )
        assert panel["targets"] and all(t["refId"] and t["expr"] for t in panel["targets"]), panel
    draw = _renderer()
    set_gpu_state(lab.node("lab01"), "busy")
    set_gpu_state(lab.node("lab02"), "idle")
    try:
        assert run_fab(lab.root, "-H", "lab01", "patch").returncode == 0
        with promlab.Monitoring(tmp_path, RULES) as mon:
            done = run_fab(
                lab.root,
                "-H",
                "lab01,lab02",
                "schedule",
                "verify",
                "--textfile-dir",
                str(mon.textfiles),
            )
            assert done.returncode == 0, done.stdout + done.stderr
            lines = ours(lab)
            assert len(lines) == 2, lines
            start = time.time()

            def tick(*which: str) -> None:
                for line in lines:
                    if not which or any(f"cd {lab.node(w).state_dir}/" in line for w in which):
                        assert as_cron_runs(line).returncode == 0
                gpu = run_fab(
                    lab.root,
                    "-H",
                    "lab01,lab02",
                    "gpu",
                    "--metrics",
                    str(mon.textfiles / "fleetops-gpu.prom"),
                )
                assert gpu.returncode in (0, 10), gpu.stdout + gpu.stderr  # 10: a GPU busy (lab01)
                time.sleep(6)

            tick()
            mon.wait_until(
                "both hosts scraped",
                lambda: len(mon.query("count by (host) (fleetops_check_ok)")) == 2,
            )
            target = lab.node("lab01").module_file(GENERATOR)
            patched = target.read_text()
            drift(lab)
            tick("lab01")
            target.write_text(patched)  # put right by hand
            tick("lab01")
            end = time.time()
            for panel in panels:
                for t in panel["targets"]:
                    got = mon.api(
                        "query_range",
                        query=draw.expanded(t["expr"]),
                        start=str(start),
                        end=str(end),
                        step="1",
                    )
                    assert got["resultType"] == "matrix", got
            drifted = mon.api(
                "query_range",
                query=draw.expanded(panels[1]["targets"][0]["expr"]),
                start=str(start),
                end=str(end),
                step="1",
            )["result"]
            # the drift is in the data
            assert any(float(v) == 1 for r in drifted for _, v in r["values"]), drifted
            svg = draw.render(
                f"http://{promlab.LOOPBACK}:{mon.prometheus_port}", dashboard, start, end, 1.0
            )
    finally:
        set_gpu_state(lab.node("lab01"), "idle")
    root = ElementTree.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}g")) == 3
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert {"lab01 passing", "lab02 passing", "lab01 drifted files", "lab01", "lab02"} <= set(
        titles
    ), titles
    kept = os.environ.get("FLEETOPS_DASHBOARD_SVG")
    if kept:
        Path(kept).write_text(svg)
