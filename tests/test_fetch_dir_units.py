"""`fetch` of a directory, without a network: the node's plan (every file under it with its sha256,
symlinks that lead out refused, FIFOs and linked directories skipped), the resume command the client
prints, and the quiet death of paramiko's read-ahead thread."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from fleetops import compat
from fleetops.tasks.oncall import _fetch_plan, resume_command
from remote_scripts.jobs.fetch import fetch_plan


def _tree(state: Path) -> Path:
    out = state / "out"
    (out / "sub" / "deeper").mkdir(parents=True)
    (out / "a.safetensors").write_bytes(b"a" * 1000)
    (out / "sub" / "b.bin").write_bytes(b"b" * 10)
    (out / "sub" / "deeper" / "c.json").write_text("{}")
    (out / "empty.txt").write_bytes(b"")
    return out


def test_a_directory_is_every_file_under_it_each_with_its_own_sha256(tmp_path):
    out = _tree(tmp_path)
    plan = fetch_plan({"state_dir": str(tmp_path), "paths": ["out"]})
    files = plan["files"]
    assert [f["rel"] for f in files] == [
        "a.safetensors",
        "empty.txt",
        "sub/b.bin",
        "sub/deeper/c.json",
    ]
    for f in files:
        data = (out / f["rel"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data)
        assert f["local"] == f"state/out/{f['rel']}" and f["dir"]["local"] == "state/out"
        assert f["path"] == str(out / f["rel"]) and "error" not in f


def test_a_symlink_leading_out_of_the_directory_is_refused_one_inside_is_copied(tmp_path):
    out = _tree(tmp_path)
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("not yours")
    (out / "escape").symlink_to(secret)
    (out / "inside").symlink_to(out / "sub" / "b.bin")
    (out / "loop").symlink_to(out)
    os.mkfifo(out / "pipe")
    plan = fetch_plan({"state_dir": str(tmp_path), "paths": ["out"]})
    by = {f["rel"]: f for f in plan["files"]}
    assert by["escape"]["error_kind"] == "refused" and "leads outside out" in by["escape"]["error"]
    assert "sha256" not in by["escape"]
    assert (
        by["inside"]["path"] == str(out / "sub" / "b.bin")
        and by["inside"]["local"] == "state/out/inside"
    )
    assert "loop" not in by and "pipe" not in by  # skipped, and said so
    assert any("out/loop: a symlink to a directory; skipped" in n for n in plan["notes"])
    assert any("out/pipe: not a regular file; skipped" in n for n in plan["notes"])
    secret.unlink()


def test_a_directory_outside_the_state_dir_is_still_refused_without_any_path(tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "x").write_text("x")
    state = tmp_path / "state"
    state.mkdir()
    plan = fetch_plan({"state_dir": str(state), "paths": [str(other)]})
    assert (
        plan["files"][0]["error_kind"] == "refused"
        and "outside the state and job directories" in plan["files"][0]["error"]
    )
    plan = fetch_plan({"state_dir": str(state), "paths": [str(other)], "any_path": True})
    assert [f["local"] for f in plan["files"]] == [f"other{other}/x"]


def test_an_empty_directory_says_so(tmp_path):
    (tmp_path / "nothing").mkdir()
    plan = fetch_plan({"state_dir": str(tmp_path), "paths": ["nothing"]})
    assert plan["files"] == [] and plan["notes"] == [
        "nothing: an empty directory; nothing to fetch"
    ]


def test_the_resume_command_repeats_every_option_as_given_quoted(tmp_path):
    plan = _fetch_plan(
        None,
        {
            "path": ["out dir", "x.log"],
            "any_path": True,
            "job_id": "j1",
            "max_size": "5G",
            "dest": str(tmp_path / "my dest"),
        },
    )  # type: ignore[arg-type]
    words = shlex.split(resume_command("lab01", plan))
    assert words == [
        "fab",
        "-H",
        "lab01",
        "fetch",
        "--path",
        "out dir",
        "--path",
        "x.log",
        "--job-id",
        "j1",
        "--any-path",
        "--max-size",
        "5G",
        "--dest",
        str(tmp_path / "my dest"),
    ]
    plan = _fetch_plan(None, {"dest": "rel"})  # type: ignore[arg-type]
    assert (
        resume_command("lab01", plan)
        == f"fab -H lab01 fetch --dest {shlex.quote(str(Path('rel').absolute()))}"
    )


def test_the_read_ahead_threads_socket_closed_is_not_printed_other_threads_are():
    printed: list[str] = []
    saved = threading.excepthook
    threading.excepthook = lambda args: printed.append(f"{args.thread.name}: {args.exc_value}")
    try:
        assert compat.quiet_prefetch_thread()  # the fast path is on with the installed paramiko

        def _prefetch_thread() -> None:  # the name paramiko's read-ahead thread runs
            raise OSError("Socket is closed")

        def other() -> None:
            raise OSError("Socket is closed")

        for target, name in ((_prefetch_thread, "prefetch"), (other, "other")):
            t = threading.Thread(target=target, name=name)
            t.start()
            t.join()
    finally:
        threading.excepthook = saved
    assert printed == ["other: Socket is closed"]


SWAPPER = """
import os, sys, time
d, target, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
sub, real, link = os.path.join(d, "sub"), os.path.join(d, ".subreal"), os.path.join(d, ".sublink")
os.symlink(target, link)
print("swapping", flush=True)
end = time.time() + secs
while time.time() < end:
    os.rename(sub, real); os.rename(link, sub)  # sub: a symlink to the outside
    os.rename(sub, link); os.rename(real, sub)  # sub: the real directory again
"""


def test_a_subdirectory_swapped_for_a_symlink_mid_walk_never_fetches_the_outside(tmp_path):
    # A real race, as an attacker who may write the fetched directory runs it: a tight loop swaps
    # sub/ for a link to a directory outside while fetch plans the directory again and again. Walked
    # by path (os.walk), the plan listed outside/secret.txt at plan 219, 592 and 795 of three runs;
    # by descriptor never.
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "secret.txt").write_text("inside, the directory's own\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    outside_sha = hashlib.sha256(b"OUTSIDE-SECRET\n").hexdigest()
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(out), str(outside), "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "swapping\n"
        leaked, plans, end = [], 0, time.monotonic() + 20
        while plans < 3000 and time.monotonic() < end and not leaked:
            plans += 1
            for f in fetch_plan({"state_dir": str(tmp_path), "paths": ["out"]})["files"]:
                if f.get("sha256") == outside_sha or str(outside) in str(f.get("path", "")):
                    leaked.append((plans, f))
    finally:
        swapper.kill()
        swapper.wait()
    assert leaked == [], leaked[:1]
    assert plans >= 1000, plans  # enough tries that the walk by path lost
