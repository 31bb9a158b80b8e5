"""No space left on device, named with its path, on a real lab node (tiny tmpfs mounts, so root
only): a job whose output directory fills ends "failed" with "no space left on device writing
<path>" in `status` (the node reads it from the job's log and its own paths, and records it with the
exit status); a patch whose state dir is full names that directory, not just "no space left on
device"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import fab_json, run_fab

pytestmark = [pytest.mark.lab, pytest.mark.root("mounting a tmpfs needs root")]

# Writes 4 KiB blocks into argv[1] until the disk is full: Python's write() error names no file, so
# the node finds the full filesystem among the job's own paths (argv[1] here).
FILL = (
    "import os, sys\n"
    "out = sys.argv[1]\n"
    "print('writing into ' + out, flush=True)\n"
    "with open(os.path.join(out, 'part-0.bin'), 'wb') as f:\n"
    "    while True:\n"
    "        f.write(b'x' * 4096)\n"
    "        f.flush()\n"
)
# The same with coreutils' dd, whose error names the file itself.
DD = "dd if=/dev/zero of={out}/part-0.bin bs=4k count=10000"


def book(tmp_path: Path, out: Path) -> Path:
    path = tmp_path / "fill.yaml"
    path.write_text(
        "name: fill\njobs:\n  fill:\n    kind: command\n    command: "
        f"{json.dumps(['{python}', '-c', FILL, str(out)])}\n    preflight: []\n    gpu_gate: "
        "false\n  ddfill:\n    kind: command\n    command: "
        f"{json.dumps(['sh', '-c', DD.format(out=out)])}\n"
        "    preflight: []\n    gpu_gate: false\n"
    )
    return path


def mount_tmpfs(path: Path, size: str, mode: str = "0755") -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(path)], check=True
    )


def umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("job", ["fill", "ddfill"])
def test_a_full_output_dir_is_named_in_status(lab, tmp_path, job):
    out = tmp_path / "out"
    mount_tmpfs(out, "64k")
    playbook = book(tmp_path, out)
    try:
        proc = run_fab(
            lab.root,
            "-H",
            "lab01",
            "extract",
            "--job",
            job,
            "--playbook",
            str(playbook),
            "tail",
            "--job",
            job,
            "--playbook",
            str(playbook),
            timeout=300,
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (
            proc.stdout[-3000:] + proc.stderr
        )
        rc, doc = fab_json(
            lab.root, "-H", "lab01", "status", "--job", job, "--playbook", str(playbook)
        )
    finally:
        umount(out)
    result = doc["results"][0]
    assert rc == 1 and result["data"]["state"] == "failed", result
    where = str(out / "part-0.bin") if job == "ddfill" else str(out)
    assert f"no space left on device writing {where}" in result["msg"], result["msg"]
    assert result["data"]["exit"]["no_space"]["path"] == where, result["data"]["exit"]


def test_a_full_state_dir_is_named_by_patch(lab):
    node = lab.node("lab01")
    state = Path(node.state_dir)
    saved = state.with_name(state.name + ".saved")
    subprocess.run(["cp", "-a", str(state), str(saved)], check=True)
    mount_tmpfs(state, "32m", mode="0700")
    try:
        subprocess.run(["cp", "-a", f"{saved}/.", str(state)], check=True)
        # the agent is there before the disk fills
        assert fab_json(lab.root, "-H", "lab01", "ping")[0] == 0
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={state}/filler", "bs=4k", "count=100000"],
            capture_output=True,
        )
        rc, doc = fab_json(lab.root, "-H", "lab01", "patch")
    finally:
        umount(state)
        subprocess.run(["rm", "-rf", str(saved)], check=True)
    msg = doc["results"][0]["msg"]
    assert (
        rc == 1 and f"no space left on device writing {state}/" in msg and f"df -h {state}" in msg
    ), msg
