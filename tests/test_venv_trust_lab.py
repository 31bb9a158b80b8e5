"""The node's Python is covered by the trust rules, against a real lab node.

- A `.pth` file that another user (uid 65534) drops into an others-writable site-packages never
  runs: the agent starts with `-I -S`, checks the interpreter (executable, prefixes, sys.path,
  site-packages and their .pth files) before `site` reads any .pth, and refuses, naming the path and
  the fix. `--allow-insecure-venv` runs it anyway, with the warning on the operator's screen.
- `PYTHONPATH` in the login environment is not honoured (the agent's Python runs isolated, `-I`): a
  sitecustomize.py there never runs.

Code that must never run would create a marker file, and the marker never appears."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import fab_json_output, run_fab

pytestmark = [pytest.mark.lab, pytest.mark.root("the .pth is dropped by uid 65534 through setpriv")]
NOBODY = 65534


def host_yaml(lab, name: str, python: Path, state_dir: Path) -> str:
    node = lab.node("lab01")
    return "\n".join(
        [
            "hosts:",
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {node.port}",
            f"    user: {lab.user}",
            f"    identity_file: {lab.client_key}",
            f"    known_hosts: {lab.known_hosts}",
            "    lab: true",
            f"    python: {python}",
            f"    state_dir: {state_dir}",
            "    gpus: 2",
            "",
        ]
    )


@pytest.fixture
def place(lab):
    """/tmp/<new> (0755) holding a venv made from the lab node's Python, a state dir and a 1777
    marks/; the hosts file naming them is removed at the end."""
    top = Path(tempfile.mkdtemp(prefix="fleetops-venv-", dir="/tmp"))
    top.chmod(0o755)
    (top / "marks").mkdir()
    (top / "marks").chmod(0o1777)
    node = lab.node("lab01")
    subprocess.run(
        [str(node.python), "-m", "venv", "--without-pip", str(top / "venv")],
        check=True,
        timeout=120,
    )
    hosts = lab.root / "hosts" / "venvtrust.yaml"
    yield top, hosts
    hosts.unlink(missing_ok=True)
    shutil.rmtree(top, ignore_errors=True)


def site_dir(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    return site


def test_a_pth_dropped_in_others_writable_site_packages_never_runs_and_the_run_is_refused(
    lab, place
):
    top, hosts = place
    site, marker = site_dir(top / "venv"), top / "marks" / "pth-ran"
    hosts.write_text(host_yaml(lab, "venv01", top / "venv" / "bin" / "python", top / "state"))
    site.chmod(0o777)  # the premise: site-packages writable by another user
    drop = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "sh",
            "-c",
            'printf "%s\\n" "$2" > "$1"',
            "sh",
            str(site / "zz-planted.pth"),
            f"import os; open({str(marker)!r}, 'w').write('ran as uid %d' % os.geteuid())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drop.returncode == 0 and (site / "zz-planted.pth").stat().st_uid == NOBODY, drop.stderr
    for task in ("ping", "verify"):
        rc, doc, both = fab_json_output(lab.root, "-H", "venv01", task)
        (result,) = doc["results"]
        assert not marker.exists(), f"{marker.read_text()}\n{both}"
        assert rc == 1 and result["status"] == "failed", both
        msg = result["msg"]
        assert f"{site} is writable by group or others" in msg and "(0777)" in msg, msg
        assert f"chmod go-w {site}" in msg and "--allow-insecure-venv" in msg and "\n" not in msg, (
            msg
        )
    # the agent's zip was uploaded (it is read and verified before the interpreter is checked),
    # nothing else
    assert sorted(p.name for p in (top / "state").iterdir()) == ["bin"]


def test_allow_insecure_venv_runs_with_the_warning_shown(lab, place):
    top, hosts = place
    site = site_dir(top / "venv")
    hosts.write_text(host_yaml(lab, "venv01", top / "venv" / "bin" / "python", top / "state"))
    site.chmod(0o777)
    proc = run_fab(
        lab.root, "-H", "venv01", "ping", "--allow-insecure-venv", env={"COLUMNS": "400"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "node warning: --allow-insecure-venv: running anyway, as asked:" in proc.stdout, (
        proc.stdout
    )
    assert f"{site} is writable by group or others" in proc.stdout, proc.stdout
    site.chmod(0o755)
    proc = run_fab(lab.root, "-H", "venv01", "ping", env={"COLUMNS": "400"})
    assert proc.returncode == 0 and "warning" not in proc.stdout, proc.stdout


def test_pythonpath_from_the_login_environment_is_ignored(lab, place):
    top, hosts = place
    marker, hooks = top / "marks" / "pythonpath-ran", top / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        f"open({str(marker)!r}, 'w').write('PYTHONPATH was honoured')\n"
    )
    # The node's login environment sets PYTHONPATH: the inventory's python is a wrapper that exports
    # it and execs the real interpreter with the words fleetops gave.
    wrapper = top / "python"
    wrapper.write_text(
        f"#!/bin/sh\nPYTHONPATH={hooks}; export PYTHONPATH\nexec {top / 'venv' / 'bin' / 'python'} "
        '"$@"\n'
    )
    wrapper.chmod(0o755)
    plain = subprocess.run([str(wrapper), "-c", "pass"], capture_output=True, text=True, timeout=60)
    # the hook works for a plain start
    assert plain.returncode == 0 and marker.exists(), plain.stderr
    marker.unlink()
    hosts.write_text(host_yaml(lab, "pp01", wrapper, top / "state"))
    rc, doc, both = fab_json_output(lab.root, "-H", "pp01", "ping")
    assert rc == 0 and not marker.exists(), both
    # verify's checks run in the agent's children too (this venv lacks the playbook's packages: they
    # fail)
    rc, doc, both = fab_json_output(lab.root, "-H", "pp01", "verify")
    assert not marker.exists(), f"{marker.read_text()}\n{both}"
    assert doc["results"][0]["msg"].endswith("checks passed"), both
