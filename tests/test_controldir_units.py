"""The OpenSSH transport's control directory: made 0700, refused when it is a symlink, someone
else's, open to others or too long for a socket path; a master's record written whole and listed
only while its socket lives."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from fleetops.wire import controldir
from fleetops.wire.controldir import ControlDirError, MasterRecord


@pytest.fixture
def short_path():
    """A directory with a short path: pytest's own tmp_path is too long for a socket's directory."""
    path = tempfile.mkdtemp(prefix="cm", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _record(name: str, used: float) -> MasterRecord:
    return MasterRecord(
        socket=name,
        host="lab01",
        hostname="127.0.0.1",
        user="u",
        port=2222,
        jump="",
        opened=1.0,
        used=used,
    )


def test_the_directory_is_made_private(short_path, monkeypatch):
    tmp_path = short_path
    target = tmp_path / "cm"
    monkeypatch.setenv(controldir.CONTROL_DIR_ENV, str(target))
    assert controldir.control_dir() == str(target)
    assert (target.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("spoil", ["symlink", "open", "file", "long"])
def test_an_unsafe_directory_is_refused_saying_why(short_path, monkeypatch, spoil):
    tmp_path = short_path
    target = tmp_path / "cm"
    if spoil == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "real")
    elif spoil == "open":
        target.mkdir()
        target.chmod(0o733)
    elif spoil == "file":
        target.write_text("")
    else:
        target = tmp_path / ("x" * controldir.MAX_DIR_CHARS)
    monkeypatch.setenv(controldir.CONTROL_DIR_ENV, str(target))
    with pytest.raises(ControlDirError) as caught:
        controldir.control_dir()
    said = str(caught.value)
    assert str(target) in said and controldir.CONTROL_DIR_ENV in said
    why = {
        "symlink": "symlink",
        "open": "chmod 700",
        "file": "not a directory",
        "long": "would not fit",
    }
    assert why[spoil] in said


def test_records_list_live_masters_least_recently_used_first(short_path):
    directory = str(short_path)
    os.chmod(directory, 0o700)
    listeners = []
    for name in ("a" * 40, "b" * 40):
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(directory, name))
        listeners.append(s)
    controldir.write_record(directory, _record("a" * 40, used=20.0))
    controldir.write_record(directory, _record("b" * 40, used=10.0))
    controldir.write_record(directory, _record("c" * 40, used=5.0))  # its master is gone: no socket
    assert [r.socket for r in controldir.records(directory)] == ["b" * 40, "a" * 40]
    controldir.touch(directory, "b" * 40)
    assert [r.socket for r in controldir.records(directory)] == ["a" * 40, "b" * 40]
    controldir.forget(directory, "a" * 40)
    assert [r.socket for r in controldir.records(directory)] == ["b" * 40]
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
    for s in listeners:
        s.close()


@pytest.mark.parametrize(
    "raw", [b"{", b"[]", b'{"socket": "x"}', b"x" * (controldir.MAX_RECORD_BYTES + 1)]
)
def test_a_bad_record_is_ignored(raw):
    assert controldir.parse_record(raw) is None


def test_one_process_at_a_time_starts_a_sockets_master(short_path):
    """start_lock across processes: a second holder waits until the first lets go, and gives up
    when asked or when its time is out, never holding the lock then."""
    import subprocess
    import sys
    import time

    directory = str(short_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom fleetops.wire import controldir\n"
            f"with controldir.start_lock({directory!r}, 'abc', lambda: False, 5) as held:\n"
            "    print(held, flush=True)\n    time.sleep(1.0)\n"
            "    letting_go = time.time()\nprint(letting_go, flush=True)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
    with controldir.start_lock(directory, "abc", lambda: False, 0.2) as held:
        assert held is False  # the other process holds it: out of time
    with controldir.start_lock(directory, "abc", lambda: True, 30) as held:
        assert held is False  # asked to give up
    with controldir.start_lock(directory, "abc", lambda: False, 30) as held:
        taken = time.time()
        assert held is True
    assert float(holder.stdout.readline()) <= taken  # only once the other was letting go
    holder.wait()
    assert oct(os.stat(os.path.join(directory, ".abc.lock")).st_mode & 0o777) == "0o600"


def test_a_link_in_place_of_the_lock_is_refused(short_path, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, short_path / ".abc.lock")
    lock = controldir.start_lock(str(short_path), "abc", lambda: False, 1)
    with pytest.raises(ControlDirError, match=r"\.abc\.lock: .*\(remove it\)"), lock:
        pass
    assert target.read_text() == ""
