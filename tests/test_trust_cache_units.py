"""The agent zip's verdict (remote_scripts/core/bootstrap.py: _verdict; launch.keep_verdict): a
start whose read of the zip ends with the identity the verdict names takes the zip's sha256 from it
instead of hashing it, and anything else about the zip or the verdict means the full check, which
refuses a changed zip as before. The real bootstrap and agent, started as the client starts them,
without SSH."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from agentrun import answers, run_agent

from fleetops.wire.bundle import PYTHON_FLAGS, agent_bundle

NOBODY = 65534
PING = [{"op": "ping"}]


def _python() -> Path:
    return Path(sys.executable)


def _pyz(state: Path) -> Path:
    return state / "bin" / agent_bundle().filename


def _verdict(state: Path) -> Path:
    return Path(f"{_pyz(state)}.verdict")


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    """State dirs whose zip was put there (by a first start) more than 2 s ago: old enough for a
    verdict to be kept. One sleep for the whole module."""
    made = []
    for i in range(8):
        state = tmp_path_factory.mktemp(f"verdict{i}") / "state"
        answers(_python(), state, PING)
        made.append(state)
    time.sleep(2.2)
    return iter(made)


def _hashed(state: Path) -> bool:
    """Whether this start hashed the zip (loaded hashlib's OpenSSL), seen in -X importtime."""
    proc = run_agent(_python(), state, PING, flags=(*PYTHON_FLAGS, "-X", "importtime"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return " _hashlib" in proc.stderr


def _refusal(state: Path) -> dict:
    proc = run_agent(_python(), state, PING)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    return json.loads(proc.stdout.splitlines()[-1])


def _tamper(state: Path, *, replace: bool = False) -> None:
    """Change one byte of the zip's comment-free middle, keeping its size and mtime (and, with
    replace, putting a changed copy in its place by rename instead)."""
    pyz = _pyz(state)
    before = pyz.stat()
    data = bytearray(pyz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    if replace:
        other = pyz.with_name("other")
        other.write_bytes(bytes(data))
        other.chmod(0o600)
        os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.rename(other, pyz)
    else:
        with open(pyz, "r+b") as f:
            f.write(bytes(data))
        os.utime(pyz, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = pyz.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_an_unchanged_zip_is_hashed_once_then_taken_from_its_verdict(aged):
    state = next(aged)
    assert _hashed(state)  # no verdict yet: hashed, and the verdict kept
    v = _verdict(state)
    st = v.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert agent_bundle().sha256 in v.read_text()
    assert not _hashed(state)  # the verdict named this very file: not hashed again
    assert not _hashed(state)


def test_a_zip_changed_in_place_after_its_verdict_is_refused(aged):
    state = next(aged)
    answers(_python(), state, PING)
    assert _verdict(state).exists()
    _tamper(state)  # same size, same mtime: only the ctime tells
    got = _refusal(state)
    assert got["error_kind"] == "agent_mismatch" and got["expected"] == agent_bundle().sha256


def test_a_zip_replaced_after_its_verdict_is_refused(aged):
    state = next(aged)
    answers(_python(), state, PING)
    assert _verdict(state).exists()
    _tamper(state, replace=True)
    assert _refusal(state)["error_kind"] == "agent_mismatch"


def _forge(state: Path) -> Path:
    """After tampering with the zip: a verdict naming the changed zip's identity with the sha256 the
    client expects, as the real one would, had the bootstrap hashed the changed bytes to it."""
    pyz, v = _pyz(state), _verdict(state)
    real = v.read_text()
    st = pyz.stat()
    ident = (st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size)
    forged = (
        f"fleetops-verdict-1 {agent_bundle().sha256} {ident!r} {st.st_mtime_ns} {st.st_ctime_ns}\n"
    )
    assert forged.split()[:2] == real.split()[:2] and forged != real
    v.write_text(forged)
    return v


def test_a_verdict_others_may_write_is_not_believed(aged):
    state = next(aged)
    answers(_python(), state, PING)
    _tamper(state)
    v = _forge(state)
    for mode in (0o620, 0o602):
        v.chmod(mode)
        assert _refusal(state)["error_kind"] == "agent_mismatch"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_verdict_another_user_owns_is_not_believed(aged):
    state = next(aged)
    answers(_python(), state, PING)
    _tamper(state)
    v = _forge(state)
    v.chmod(0o600)
    os.chown(v, NOBODY, NOBODY)
    assert _refusal(state)["error_kind"] == "agent_mismatch"


def test_a_verdict_that_is_a_symlink_is_not_followed(aged):
    state = next(aged)
    answers(_python(), state, PING)
    _tamper(state)
    v = _forge(state)
    elsewhere = state.parent / "elsewhere.verdict"
    os.rename(v, elsewhere)
    v.symlink_to(elsewhere)
    assert _refusal(state)["error_kind"] == "agent_mismatch"


def test_a_corrupt_verdict_means_the_full_check_and_is_written_again(aged):
    state = next(aged)
    answers(_python(), state, PING)
    v = _verdict(state)
    for junk in ("", "fleetops-verdict-1 " + "0" * 64 + " (1, 2) 3 4\n", "\xff" * 600):
        v.write_text(junk, encoding="latin-1")
        assert _hashed(state)  # not believed: hashed, ran, and kept a fresh verdict
        assert v.read_text() != junk and agent_bundle().sha256 in v.read_text()
        assert not _hashed(state)


def test_a_zip_changed_in_the_last_two_seconds_gets_no_verdict(tmp_path):
    state = tmp_path / "state"
    answers(_python(), state, PING)  # the zip was written just now
    assert not _verdict(state).exists()
    assert not list((state / "bin").glob("*.tmp"))
