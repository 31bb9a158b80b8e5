"""ENOSPC named with its path: the job's exit record reads where from the log's last lines (Python's
OSError with a file, coreutils' "error writing", or a bare Errno 28 and the job's own paths), and
the node's error text names the file an atomic write could not write."""

from __future__ import annotations

import errno
import os

from remote_scripts.core.atomicio import os_error_message
from remote_scripts.jobs import keeper
from remote_scripts.jobs.records import LOG


def job_dir_with_log(tmp_path, text: str) -> str:
    (tmp_path / LOG).write_text(text)
    return str(tmp_path)


def test_the_path_comes_from_the_logs_line(tmp_path):
    cases = {
        (
            "OSError: [Errno 28] No space left on device: '/data/out/shard-3.safetensors'"
        ): "/data/out/shard-3.safetensors",
        "dd: error writing '/data/out/part-0.bin': No space left on device": "/data/out/part-0.bin",
        "tee: /data/out/log.txt: No space left on device": "/data/out/log.txt",
    }
    for line, path in cases.items():
        found = keeper.no_space(
            job_dir_with_log(tmp_path, f"started\nTraceback (most recent call last):\n{line}\n"), {}
        )
        assert found == {"path": path, "line": line}, line


def test_a_line_without_a_file_gets_none_unless_a_job_path_is_full(tmp_path, monkeypatch):
    line = "OSError: [Errno 28] No space left on device"
    job_dir = job_dir_with_log(tmp_path, f"{line}\n")
    job = {"argv": ["/usr/bin/python3", "-c", "...", "/data/out"], "cwd": str(tmp_path)}
    assert keeper.no_space(job_dir, job) == {"path": None, "line": line}  # nothing full here
    monkeypatch.setattr(
        keeper, "disk_full", lambda p: {"path": p, "free_bytes": 0} if p == "/data" else None
    )
    assert keeper.no_space(job_dir, job) == {"path": "/data/out", "line": line}


def test_a_log_without_enospc_says_nothing(tmp_path):
    assert keeper.no_space(job_dir_with_log(tmp_path, "ValueError: bad model\n"), {}) is None
    assert keeper.no_space(str(tmp_path / "missing"), {}) is None


def test_the_error_text_names_the_file():
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/state/lock.json")
    assert os_error_message(exc, "patch failed") == (
        "patch failed: no space left on device writing "
        "/state/lock.json; free space on that filesystem (df -h /state)"
    )
    assert os_error_message(OSError(errno.EROFS, "x", "/a"), "w") == "w: read-only file system (/a)"
