"""Writes by descriptor, into directories only root and the login user may change, against a real
lab node with a real non-root login user (sudoers entry as docs/become.md recommends), a real
attacker in a team group that may write one package directory of the venv, and the attacker's real
race: an inotify watcher that, the moment fleetops' temp file appears beside the target, moves it
aside and puts a symlink to a victim in its place.

Written by path (chmod/chown of the temp file after it was closed), root chowned a root-only file to
the attacker (`become: sudo`) and the login user's ~/.bashrc became 0666 (no become). Now `patch`
refuses the target's directory, naming its path, mode and owner, before anything is written; the
race never gets a temp file to swap. `fetch` of a directory while a subdirectory is swapped for a
link never fetches the outside."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import becomekit
import pytest
from conftest import GENERATOR, fab_json, fab_json_output
from faultkit import SUBDIR_SWAPPER

from fleetops.lab import site_packages

pytestmark = pytest.mark.lab

LOGIN, ATTACKER, TEAM = "fleetops-wlogin", "fleetops-wattack", "fleetops-wteam"
SUDOERS = Path("/etc/sudoers.d/fleetops-writes-test")
BOOK = "playbooks/writes-test.yaml"
ATTEMPTS = 3  # written by path, the watcher won every round it was given (4 of 4 on each host)

# The attacker's watcher: the moment a fleetops temp file appears in DIR, move it aside and put a
# symlink to VICTIM under its name; print what happened. Run as the attacker with the system Python.
RACE = r"""
import ctypes, os, select, struct, sys, time
d, victim, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
libc = ctypes.CDLL("libc.so.6", use_errno=True)
fd = libc.inotify_init()
assert libc.inotify_add_watch(fd, d.encode(), 0x100) >= 0  # IN_CREATE
print("watching", flush=True)
end = time.time() + secs
while time.time() < end:
    if not select.select([fd], [], [], 0.2)[0]:
        continue
    buf, i = os.read(fd, 65536), 0
    while i < len(buf):
        ln = struct.unpack_from("iIII", buf, i)[3]
        name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode()
        i += 16 + ln
        if ".fleetops-tmp-" in name:
            p = os.path.join(d, name)
            try:
                os.rename(p, os.path.join(d, "stolen" + name))
                os.symlink(victim, p)
                print("swapped", flush=True)
            except OSError as e:
                print("missed", e, flush=True)
            sys.exit(0)
print("no temp file", flush=True)
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def as_attacker(*argv: str) -> list[str]:
    return ["setpriv", "--reuid", ATTACKER, "--regid", ATTACKER, "--init-groups", *argv]


@pytest.fixture(scope="module")
def world(lab_factory, root_user):
    becomekit.require_tools("sudo", "setpriv")
    with lab_factory.own("writes", 1, reachable=True) as lab:
        node = lab.node("lab01")
        top = becomekit.world_dir("fleetops-writes-")
        try:
            becomekit.remove_users([LOGIN, ATTACKER], TEAM)  # left by a run that was killed
            subprocess.run(["groupadd", TEAM], check=True)
            becomekit.add_login_user(LOGIN, top / "home")
            becomekit.add_team_member(ATTACKER, TEAM)
            src = site_packages(node.venv)
            root_venv = becomekit.speculators_venv(top / "venv", src)
            own_venv = becomekit.speculators_venv(top / "venv3", src)
            subprocess.run(["chown", "-R", f"{LOGIN}:{LOGIN}", str(own_venv)], check=True)
            # "the team may update it": one package, group-writable
            for venv in (root_venv, own_venv):
                spec = site_packages(venv) / "speculators"
                subprocess.run(["chgrp", "-R", TEAM, str(spec)], check=True)
                subprocess.run(["chmod", "-R", "g+w", str(spec)], check=True)
            becomekit.install_sudoers(
                SUDOERS, f"{LOGIN} ALL=(root) NOPASSWD: {root_venv}/bin/python\n"
            )
            lab.configure_sshd(node, users=(LOGIN,))
            hosts = {
                "asroot": [
                    f"    python: {root_venv}/bin/python",
                    "    become: sudo",
                    f"    state_dir: {top}/rootstate",
                ],
                "asuser": [
                    f"    python: {own_venv}/bin/python",
                    f"    state_dir: {top}/home/.fleetops",
                ],
            }
            becomekit.write_login_hosts(lab, node, LOGIN, "writes.yaml", hosts)
            becomekit.write_generator_playbook(lab, BOOK, "writes-test")
            rel = Path(*GENERATOR.split(".")).with_suffix(".py")
            pristine = top / "pristine.py"
            shutil.copy(site_packages(root_venv) / rel, pristine)
            pristine.chmod(0o644)
            yield {
                "lab": lab,
                "top": top,
                "pristine": pristine,
                "asroot": site_packages(root_venv) / rel,
                "asuser": site_packages(own_venv) / rel,
            }
        finally:
            SUDOERS.unlink(missing_ok=True)
            lab.configure_sshd(node)
            becomekit.remove_users([LOGIN, ATTACKER], TEAM)
            shutil.rmtree(top, ignore_errors=True)


def race(world: dict, host: str, victim: Path) -> list[dict]:
    """ATTEMPTS rounds of the attack: the attacker puts her own copy (0666) of the pristine module
    in place of the target, watches its directory, and `patch` runs. What each round saw."""
    lab, target = world["lab"], world[host]
    directory = target.parent
    rounds = []
    for attempt in range(1, ATTEMPTS + 1):
        for stale in directory.glob("stolen*"):
            stale.unlink()
        subprocess.run(
            as_attacker(
                "sh",
                "-c",
                f"umask 0; cp {world['pristine']} {directory}/.g && "
                f"chmod 666 {directory}/.g && mv -f {directory}/.g {target}",
            ),
            check=True,
        )
        watcher = subprocess.Popen(
            as_attacker("/usr/bin/python3", "-c", RACE, str(directory), str(victim), "60"),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert watcher.stdout is not None and watcher.stdout.readline() == "watching\n"
        rc, doc, both = fab_json_output(
            lab.root, "-H", host, "patch", "--playbook", BOOK, timeout=300
        )
        time.sleep(0.5)
        watcher.kill()
        said = watcher.communicate()[0]
        st = os.lstat(victim)
        rounds.append(
            {
                "attempt": attempt,
                "rc": rc,
                "result": doc["results"][0],
                "watcher": said,
                "victim": (st.st_uid, stat.S_IMODE(st.st_mode)),
                "target_sha": _sha(target) if not target.is_symlink() else "symlink",
                "temps": sorted(p.name for p in directory.iterdir() if ".fleetops-tmp-" in p.name),
            }
        )
    return rounds


def _refused_as_untrusted(rounds: list[dict], world: dict, host: str, owner: int) -> None:
    # speculators/: the first directory on the way the team may write
    directory = world[host].parents[1]
    for r in rounds:
        msg = json.dumps(r["result"])
        assert r["rc"] != 0 and r["result"]["status"] == "failed", r
        assert (
            f"refusing to write {world[host]}: {directory} "
            "(on the way to the file) is writable by group or "
            "others" in msg
        ), msg
        assert f"(0775), owner uid {owner}" in msg and f"chmod go-w {directory}" in msg, msg
        assert "swapped" not in r["watcher"] and r["temps"] == [], r  # nothing was written to swap
        # the target unchanged: nothing written
        assert r["target_sha"] == _sha(world["pristine"]), r


def test_become_sudo_patch_never_chowns_what_a_team_writable_package_dir_points_at(world):
    victim = world["top"] / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    rounds = race(world, "asroot", victim)
    assert [r["victim"] for r in rounds] == [(0, 0o600)] * ATTEMPTS, rounds
    assert victim.read_text() == "root only\n"
    _refused_as_untrusted(rounds, world, "asroot", 0)


def test_login_user_patch_never_chmods_its_own_bashrc_through_a_team_writable_dir(world):
    victim = world["top"] / "home" / ".bashrc"
    victim.write_text("# the login user's bashrc\n")
    shutil.chown(victim, LOGIN, LOGIN)
    victim.chmod(0o644)
    uid = int(
        subprocess.run(["id", "-u", LOGIN], capture_output=True, text=True, check=True).stdout
    )
    rounds = race(world, "asuser", victim)
    assert [r["victim"] for r in rounds] == [(uid, 0o644)] * ATTEMPTS, rounds
    _refused_as_untrusted(rounds, world, "asuser", uid)


def test_check_mode_names_the_refusal_a_real_run_would_meet(world):
    lab, target = world["lab"], world["asroot"]
    before = _sha(target)
    rc, doc, both = fab_json_output(
        lab.root, "-H", "asroot", "patch", "--check", "--playbook", BOOK, timeout=300
    )
    msg = json.dumps(doc["results"][0])
    assert rc != 0 and "would apply" not in msg, both
    assert f"{target.parents[1]} (on the way to the file) is writable by group or others" in msg, (
        msg
    )
    assert "check mode: nothing written" in msg and _sha(target) == before, msg


def test_allow_insecure_venv_writes_anyway_by_descriptor_with_the_warning(world):
    lab, target = world["lab"], world["asroot"]
    target.unlink()  # root's own pristine file again (the races above left the attacker's copy)
    shutil.copy(world["pristine"], target)
    rc, doc, both = fab_json_output(
        lab.root, "-H", "asroot", "patch", "--playbook", BOOK, "--allow-insecure-venv", timeout=300
    )
    assert rc == 0 and doc["results"][0]["status"] == "changed", both
    assert (
        "--allow-insecure-venv: writing anyway, as asked: "
        f"{target.parents[1]} (on the way to the file) is "
        "writable by group or others" in both
    ), both
    assert _sha(target) != _sha(world["pristine"]) and os.lstat(target).st_uid == 0
    rc, doc, both = fab_json_output(
        lab.root,
        "-H",
        "asroot",
        "rollback",
        "--playbook",
        BOOK,
        "--allow-insecure-venv",
        timeout=300,
    )
    assert rc == 0 and _sha(target) == _sha(world["pristine"]), both


# each walks the directory five times; on the old code the outside bytes came at fetch 15
FETCHES = 40
SPELLINGS = ("swapped", "swapped/", "./swapped", "swapped/.", "swapped//")


def test_fetch_of_a_directory_never_follows_a_subdirectory_swapped_for_a_link(world, tmp_path):
    lab = world["lab"]
    top = lab.node("lab01").state_dir / "swapped"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "secret.txt").write_text("inside: the directory's own\n")
    outside = world["top"] / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    outside_sha = hashlib.sha256(b"OUTSIDE-SECRET\n").hexdigest()
    swapper = subprocess.Popen(
        [sys.executable, "-c", SUBDIR_SWAPPER, str(top), str(outside), "600"]
    )
    got: list[str] = []
    fetches, end = 0, time.monotonic() + 300
    try:
        while fetches < FETCHES and time.monotonic() < end and not got:
            fetches += 1
            dest = tmp_path / f"dl{fetches}"
            paths = [word for spelling in SPELLINGS for word in ("--path", spelling)]
            _, doc = fab_json(lab.root, "-H", "lab01", "fetch", *paths, "--dest", str(dest))
            said = json.dumps(doc)
            got = [
                str(p)
                for p in dest.rglob("*")
                if p.is_file() and b"OUTSIDE-SECRET" in p.read_bytes()
            ]
            # planned: hashed on the node
            got += ["its sha256 in the answer"] if outside_sha in said else []
    finally:
        swapper.kill()
        swapper.wait()
        shutil.rmtree(top, ignore_errors=True)
    assert got == [], (fetches, got)
    assert fetches >= 30, fetches  # as many as the walk by path needed to lose
