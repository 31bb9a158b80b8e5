"""Under `become: sudo`, nothing runs as root from a path another user can change. A real lab node,
a real non-root login user with the sudoers entry docs/become.md shows, and a real attacker (another
user, in a team group the venvs' writable parts belong to), all made here with useradd and removed
afterwards:

- a package directory of the venv writable by the team: `verify`'s import check would import the
  attacker's `__init__.py` as root; it is refused, naming the path, and nothing of it runs; `ping`
  warns of it, importing nothing;
- only the package's `__pycache__/` writable by the team: a planted `.pyc` the import would take for
  the source; refused the same way;
- the venv's `bin/` writable by the team: sudo would run the attacker's `python` (here a wrapper
  that logs who ran it and execs the system's Python, so every check made by the interpreter itself
  passes); the client checks the path over SFTP as the login user first and refuses before sudo runs
  anything;
- a directory the team may write, fetched under become while the attacker swaps a subdirectory for a
  symlink to another directory (a real rename race): the login user's SFTP reads by path never go
  through it, and the fetch is refused naming the path, its mode and owner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import becomekit
import pytest
from conftest import fab_json_output
from faultkit import SUBDIR_SWAPPER

from fleetops.lab import site_packages

pytestmark = pytest.mark.lab

USER = "fleetops-btops"
EVE = "fleetops-bteve"
TEAM = "fleetops-btteam"
SUDOERS = Path("/etc/sudoers.d/fleetops-become-trust-test")
BOOK = "playbooks/become-trust.yaml"

# What the attacker adds in front of the package's __init__.py: a line in OUT naming the uid that
# ran it.
PLANT_SOURCE = """
import sys
init, out = sys.argv[1], sys.argv[2]
code = open(init).read()
line = "import os as _o\\nopen(%r, 'a').write('imported as euid %%d\\\\n' %% _o.geteuid())\\n" % out
tmp = init + '.new'
open(tmp, 'w').write(line + code)
import os
os.rename(tmp, init)
"""
# The .pyc variant: bytecode whose header carries the source's mtime and size, so Python takes it
# for the source.
PLANT_PYC = """
import importlib.util, marshal, os, sys
pkg, out = sys.argv[1], sys.argv[2]
src = os.path.join(pkg, '__init__.py')
st = os.stat(src)
code = "import os as _o\\nopen(%r, 'a').write('pyc ran as euid %%d\\\\n' %% _o.geteuid())\\n" % \
out + open(src).read()
data = (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, 'little') + (int(st.st_mtime) & \
0xFFFFFFFF).to_bytes(4, 'little')
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, 'little') + marshal.dumps(compile(code, src, \
'exec')))
with open(os.path.join(pkg, '__pycache__', '__init__.%s.pyc' % sys.implementation.cache_tag), \
'wb') as f:
    f.write(data)
"""
REPLACE = """
import os, sys
path, text = sys.argv[1], sys.argv[2]
with open(path + '.new', 'w') as f:
    f.write(text)
os.chmod(path + '.new', 0o755)
os.rename(path + '.new', path)
"""
WRAPPER = '#!/bin/sh\necho "wrapper ran as: $(id)" >> {out}\nexec /usr/bin/python3 "$@"\n'


def as_eve(*argv: str) -> None:
    subprocess.run(
        ["setpriv", "--reuid", EVE, "--regid", EVE, "--init-groups", *argv],
        check=True,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def world(lab_factory, root_user):
    becomekit.require_tools("sudo", "setpriv")
    with lab_factory.own("becometrust", 1, reachable=True) as lab:
        node = lab.node("lab01")
        top = becomekit.world_dir("fleetops-become-trust-")
        try:
            becomekit.remove_users([USER, EVE], TEAM)  # left by a run that was killed
            subprocess.run(["groupadd", "-f", TEAM], check=True)
            becomekit.add_login_user(USER, top / "home")  # its password is never used: keys only
            becomekit.add_team_member(EVE, TEAM)
            src = site_packages(node.venv)
            becomekit.speculators_venv(top / "venv", src)  # its speculators/: the team's, per test
            becomekit.speculators_venv(top / "venv2", src)  # its bin/ is the team's
            subprocess.run(["chgrp", TEAM, str(top / "venv2" / "bin")], check=True)
            (top / "venv2" / "bin").chmod(0o775)
            pythons = [top / "venv" / "bin" / "python", top / "venv2" / "bin" / "python"]
            becomekit.install_sudoers(
                SUDOERS, f"{USER} ALL=(root) NOPASSWD: {', '.join(map(str, pythons))}\n"
            )
            lab.configure_sshd(node, users=(USER,))
            hosts = {
                "asroot": [
                    f"    python: {pythons[0]}",
                    f"    state_dir: {top}/rootstate",
                    "    become: sudo",
                ],
                "asroot2": [
                    f"    python: {pythons[1]}",
                    f"    state_dir: {top}/rootstate2",
                    "    become: sudo",
                ],
            }
            becomekit.write_login_hosts(lab, node, USER, "become.yaml", hosts)
            becomekit.write_generator_playbook(
                lab,
                BOOK,
                "become-trust",
                "verify:\n  - name: spec-imports\n    kind: import\n    module: speculators\n",
            )
            yield lab, top
        finally:
            SUDOERS.unlink(missing_ok=True)
            lab.configure_sshd(node)
            becomekit.remove_users([USER, EVE], TEAM)
            shutil.rmtree(top, ignore_errors=True)


def fab(lab, *args: str) -> tuple[int, dict, str]:
    return fab_json_output(lab.root, *args, timeout=300)


def plant_in_a_team_writable_package(spec: Path, out: Path) -> None:
    """The package directory made the team's to write (group-writable, as a shared venv's often
    is), and Eve's lines put in front of its __init__.py: importing it appends a line to `out`."""
    subprocess.run(["chgrp", "-R", TEAM, str(spec)], check=True)
    subprocess.run(["chmod", "-R", "g+w", str(spec)], check=True)
    as_eve("/usr/bin/python3", "-c", PLANT_SOURCE, str(spec / "__init__.py"), str(out))


@pytest.fixture
def spec(world):
    """The venv's speculators package, root's and writable by root alone again after each test."""
    _, top = world
    pkg = site_packages(top / "venv") / "speculators"
    pristine = (pkg / "__init__.py").read_bytes()
    yield pkg
    shutil.rmtree(pkg / "__pycache__", ignore_errors=True)
    (pkg / "__init__.py").write_bytes(pristine)
    subprocess.run(["chown", "-R", "root:root", str(pkg)], check=True)
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(pkg)], check=True)


def test_a_clean_root_venv_is_verified_as_root_without_a_refusal(world, spec):
    lab, _ = world
    rc, doc, both = fab(lab, "-H", "asroot", "verify", "-p", BOOK)
    result = doc["results"][0]
    # the import check ran, as root
    assert result["status"] != "unreachable" and result["items"], both
    assert (
        "refusing" not in both and doc["results"][0]["data"].get("error_kind") != "untrusted_venv"
    ), both


def test_a_package_dir_another_group_may_write_is_never_imported_as_root(world, spec):
    lab, top = world
    out = top / "PWNED-import"
    plant_in_a_team_writable_package(spec, out)
    rc, doc, both = fab(lab, "-H", "asroot", "verify", "-p", BOOK)
    assert not out.exists(), out.read_text()  # the attacker's lines never ran, as root or anyone
    result = doc["results"][0]
    assert (
        rc == 1
        and result["status"] == "failed"
        and result["data"]["error_kind"] == "untrusted_venv"
    ), both
    msg = result["msg"]
    assert f"{spec} is writable by its group" in msg and "drwxrwxr-x (0775)" in msg, msg
    assert "owner uid 0" in msg and "--allow-insecure-venv" in msg, msg
    # The one override: the operator says go on, and is warned what it means
    (spec / "__init__.py").write_bytes((spec / "__init__.py").read_bytes().split(b"\n", 2)[2])
    rc, doc, both = fab(lab, "-H", "asroot", "verify", "-p", BOOK, "--allow-insecure-venv")
    warnings = doc["results"][0]["data"].get("node_warnings") or []
    assert any(
        "--allow-insecure-venv: importing anyway" in w and str(spec) in w for w in warnings
    ), both
    assert not out.exists()


def test_ping_warns_of_a_package_dir_verify_would_refuse_and_imports_nothing(world, spec):
    lab, top = world
    out = top / "PWNED-ping"
    plant_in_a_team_writable_package(spec, out)
    rc, doc, both = fab_json_output(
        lab.root, "-H", "asroot", "ping", timeout=300, env={"FLEETOPS_PLAYBOOK": BOOK}
    )
    assert not out.exists(), out.read_text()  # ping imported nothing
    result = doc["results"][0]
    warnings = result["data"].get("node_warnings") or []
    assert rc == 0 and result["status"] == "ok", both
    assert any(
        "verify's importing checks would refuse" in w
        and f"{spec} is writable by its group" in w
        and "drwxrwxr-x (0775)" in w
        and "owner uid 0" in w
        for w in warnings
    ), both
    # the planted file was the attacker's
    subprocess.run(["chown", "-R", "root:root", str(spec)], check=True)
    subprocess.run(["chmod", "-R", "g-w", str(spec)], check=True)
    rc, doc, both = fab_json_output(
        lab.root, "-H", "asroot", "ping", timeout=300, env={"FLEETOPS_PLAYBOOK": BOOK}
    )
    # writable by root alone: quiet
    assert rc == 0 and not doc["results"][0]["data"].get("node_warnings"), both


def test_a_planted_pyc_in_a_pycache_another_group_may_write_is_never_imported_as_root(world, spec):
    lab, top = world
    out = top / "PWNED-pyc"
    out.write_text("")
    out.chmod(0o666)
    cache = spec / "__pycache__"
    cache.mkdir()
    subprocess.run(["chgrp", TEAM, str(cache)], check=True)
    cache.chmod(0o2775)
    as_eve("/usr/bin/python3", "-c", PLANT_PYC, str(spec), str(out))
    assert any(cache.glob("__init__.*.pyc"))
    rc, doc, both = fab(lab, "-H", "asroot", "verify", "-p", BOOK)
    assert out.read_text() == "", out.read_text()
    result = doc["results"][0]
    assert rc == 1 and result["data"]["error_kind"] == "untrusted_venv", both
    assert f"{cache} is writable by its group" in result["msg"], result["msg"]


def test_sudo_never_runs_a_python_from_a_bin_dir_another_group_may_write(world):
    lab, top = world
    out = top / "PWNED-bin"
    out.write_text("")
    out.chmod(0o666)
    bindir = top / "venv2" / "bin"
    as_eve("/usr/bin/python3", "-c", REPLACE, str(bindir / "python"), WRAPPER.format(out=out))
    rc, doc, both = fab(lab, "-H", "asroot2", "ping")
    assert out.read_text() == "", out.read_text()  # sudo never ran it: no `uid=0(root)` line
    result = doc["results"][0]
    assert (
        rc == 1 and result["status"] == "failed" and result["data"]["error_kind"] == "untrusted"
    ), both
    msg = result["msg"]
    assert (
        f"refusing to run {bindir}/python through sudo" in msg
        and f"{bindir} (on the way to the interpreter) is writable by its group" in msg
        and "nothing ran as root" in msg
    ), msg
    assert "drwxrwxr-x (0775)" in msg and "chmod go-w" in msg, msg
    assert os.stat(bindir / "python").st_uid != 0  # the attacker's file, still there, never run


def test_fetch_under_become_never_reads_through_a_directory_another_group_may_swap(world):
    lab, top = world
    shared, outside = top / "shared", top / "outside"
    (shared / "sub").mkdir(parents=True)
    outside.mkdir()
    inside_text, secret = "inside-bytes-of-the-listed-file\n", "SECRET-bytes-outside-the-list-d\n"
    assert len(inside_text) == len(secret)
    (shared / "sub" / "file.txt").write_text(inside_text)
    # the login user may read it: only the swap would fetch it
    (outside / "file.txt").write_text(secret)
    subprocess.run(["chmod", "-R", "a+rX", str(shared), str(outside)], check=True)
    subprocess.run(["chgrp", TEAM, str(shared)], check=True)
    shared.chmod(0o2775)
    swapper = subprocess.Popen(
        [
            "setpriv",
            "--reuid",
            EVE,
            "--regid",
            EVE,
            "--init-groups",
            "/usr/bin/python3",
            "-c",
            SUBDIR_SWAPPER,
            str(shared),
            str(outside),
            "120",
        ]
    )
    refused = 0
    try:
        for attempt in range(30):
            dest = top / f"fetched-{attempt}"
            rc, doc, both = fab(
                lab,
                "-H",
                "asroot",
                "fetch",
                "--path",
                str(shared),
                "--any-path",
                "--dest",
                str(dest),
            )
            assert "sha256 mismatch" not in both, (
                f"attempt {attempt}: read another file than listed\n{both}"
            )
            # nothing read
            assert not any(p.is_file() for p in dest.rglob("*")), f"attempt {attempt}: {both}"
            says = f"refusing to read {shared}/"
            if says in both:  # a file the node listed (others: links it refused itself)
                refused += 1
                assert f"{shared} (on the way to the file) is writable by its group" in both, both
                assert "drwxrwsr-x (2775)" in both and "owner uid 0" in both, both
    finally:
        swapper.kill()
        swapper.wait()
    assert refused > 0  # the client's refusal, not only the node's, was reached
