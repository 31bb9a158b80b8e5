"""The `ssh -G` store (wire/sshgcache.py) with this machine's real `ssh -G` and ssh_config files in
temporary directories: a stored answer is used only while it is what `ssh -G` prints now."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.wire import sshcmd, sshgcache

SSH = shutil.which("ssh")
pytestmark = pytest.mark.skipif(SSH is None, reason="needs OpenSSH's client (`ssh -G`)")
# a change this long before `ssh -G` runs is provable in these tests (ticks are far shorter)
TEST_RACY_NS = 50_000_000


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # a short path: the control directory must leave room for a socket name
    top = tempfile.mkdtemp(prefix="gc", dir="/tmp")
    monkeypatch.setenv("FLEETOPS_CONTROL_DIR", os.path.join(top, "cm"))
    monkeypatch.delenv(sshgcache.CACHE_ENV, raising=False)
    monkeypatch.setattr(sshgcache, "RACY_NS", TEST_RACY_NS)
    sshgcache._checked.clear()
    sshgcache._counted.clear()
    yield Path(top) / "cm"
    shutil.rmtree(top, ignore_errors=True)


class Counted:
    """The real `ssh -G`, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, argv: list[str]) -> bytes | None:
        self.runs += 1
        return sshcmd._ssh_g(argv)


def settle() -> None:
    time.sleep(TEST_RACY_NS / 1e9 + 0.02)


def argv_of(config: Path, *options: str, word: str = "web1", binary: str | None = None) -> list:
    extra = [w for o in options for w in ("-o", o)]
    return [binary or str(SSH), "-F", str(config), *extra, "-G", "--", word]


def lookup(argv: list[str]) -> tuple[bytes | None, int]:
    run = Counted()
    out = sshgcache.lookup(argv, run)
    assert out == sshcmd._ssh_g(argv), "the answer differs from a fresh ssh -G"
    return out, run.runs


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    write(tmp_path / "d" / "a.conf", "Host web*\n  Port 2201\n")
    path = write(
        tmp_path / "config",
        f"Host web1\n  User alice\n  HostName 10.0.0.1\nInclude {tmp_path}/d/*.conf\n",
    )
    settle()
    return path


def test_a_second_lookup_is_a_hit_equal_to_ssh_g(store, config):
    argv = argv_of(config)
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"user alice" in out and b"port 2201" in out
    assert lookup(argv) == (out, 0)
    entries = os.listdir(store)
    assert len(entries) == 1
    st = os.lstat(store / entries[0])
    assert oct(st.st_mode & 0o777) == "0o600" and oct(os.stat(store).st_mode & 0o777) == "0o700"


def test_an_edit_of_the_same_size_is_a_miss(store, config):
    argv = argv_of(config)
    lookup(argv)
    assert lookup(argv)[1] == 0
    config.write_text(config.read_text().replace("alice", "alicf"))
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"user alicf" in out
    assert lookup(argv)[1] == 1  # changed just now: not provable yet
    settle()
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 0


def test_an_included_file_edited_or_added_is_a_miss(store, config, tmp_path):
    argv = argv_of(config)
    lookup(argv)
    assert lookup(argv)[1] == 0
    write(tmp_path / "d" / "0.conf", "Host web1\n  Port 2300\n")
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"port 2300" in out
    settle()
    lookup(argv)
    (tmp_path / "d" / "a.conf").write_text("Host web*\n  Port 2209\n")
    (tmp_path / "d" / "0.conf").unlink()
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"port 2209" in out


def test_an_include_directory_made_later_is_a_miss(store, tmp_path):
    config = write(tmp_path / "config", f"Include {tmp_path}/later/*\nHost *\n  User bob\n")
    settle()
    argv = argv_of(config)
    lookup(argv)
    assert lookup(argv)[1] == 0
    write(tmp_path / "later" / "x", "Host *\n  User carol\n")
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"user carol" in out


def test_an_option_home_or_binary_changed_is_a_miss(store, config, tmp_path, monkeypatch):
    lookup(argv_of(config, "Port=1"))
    assert lookup(argv_of(config, "Port=1"))[1] == 0
    assert lookup(argv_of(config, "Port=2"))[1] == 1
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lookup(argv_of(config, "Port=1"))[1] == 1
    binary = tmp_path / "bin" / "ssh"
    binary.parent.mkdir()
    shutil.copy2(str(SSH), binary)
    settle()
    argv = argv_of(config, binary=str(binary))
    lookup(argv)
    assert lookup(argv)[1] == 0
    # another binary at the same path (another inode)
    shutil.copy2(str(SSH), tmp_path / "bin" / "ssh2")
    os.replace(tmp_path / "bin" / "ssh2", binary)
    assert lookup(argv)[1] == 1


@pytest.mark.parametrize(
    "line",
    [
        "Match exec true",
        'Match host web1 exec "test -e /"',
        "Match localnetwork 10.0.0.0/8",
        'Match !EXEC "false"',
        "Host web1\n  IdentityFile ${HOME}/.ssh/k",
        "CanonicalizeHostname yes",
        "KnownHostsCommand /bin/true %H",
    ],
)
def test_answers_that_can_change_with_no_file_changing_are_never_stored(store, tmp_path, line):
    write(tmp_path / "inc", line + "\n  User bob\n")
    config = write(tmp_path / "config", f"Include {tmp_path}/inc\nHost *\n  Port 2\n")
    settle()
    argv = argv_of(config)
    for _ in range(2):
        # (an ssh older than the keyword fails: never stored either)
        assert lookup(argv)[1] == 1
    assert not store.exists() or os.listdir(store) == []
    with pytest.raises(sshgcache.Uncacheable):
        sshgcache.proof_of(sshgcache.read_argv(argv))


def test_a_quoted_include_keyword_is_followed(store, tmp_path):
    write(tmp_path / "inc", "Host *\n  Port 2400\n")
    config = write(tmp_path / "config", f'"Include" {tmp_path}/inc\nHost *\n  User bob\n')
    settle()
    argv = argv_of(config)
    lookup(argv)
    assert lookup(argv)[1] == 0
    (tmp_path / "inc").write_text("Host *\n  Port 2401\n")
    out, runs = lookup(argv)
    assert runs == 1 and out is not None and b"port 2401" in out


def test_nothing_is_stored_when_ssh_reads_a_file_this_reading_missed(store, config):
    """ssh's own list of the files it read (`ssh -G -v`) must be within the proof."""
    argv = argv_of(config)
    proof = sshgcache.proof_of(sshgcache.read_argv(argv))
    assert sshgcache._agrees(argv, proof)
    missing = sshgcache.Proof({str(config): proof.files[str(config)]}, proof.dirs)
    sshgcache._checked.clear()
    assert not sshgcache._agrees(argv, missing)
    # a disagreement on these files stops storing for the process
    sshgcache._checked[tuple(sorted(proof.files))] = False
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 1
    assert not store.exists() or os.listdir(store) == []


def test_canonicalization_on_the_command_line_is_never_stored(store, config):
    argv = argv_of(config, "CanonicalizeHostname=yes", "CanonicalDomains=example.invalid")
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 1


def test_a_racy_config_is_not_stored_until_it_settles(store, tmp_path, monkeypatch):
    monkeypatch.setattr(sshgcache, "RACY_NS", 1_000_000_000)
    config = write(tmp_path / "config", "Host *\n  User bob\n")
    argv = argv_of(config)
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 1
    time.sleep(1.05)
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 0


def _entry(store: Path) -> Path:
    (name,) = os.listdir(store)
    return store / name


def test_a_symlinked_entry_is_ignored(store, config, tmp_path):
    argv = argv_of(config)
    lookup(argv)
    entry = _entry(store)
    shutil.copy2(entry, tmp_path / "copy")
    os.chmod(tmp_path / "copy", 0o600)
    entry.unlink()
    entry.symlink_to(tmp_path / "copy")
    assert lookup(argv)[1] == 1
    assert not entry.is_symlink()  # replaced by a file of its own
    assert lookup(argv)[1] == 0


def test_a_group_writable_or_foreign_entry_is_ignored(store, config):
    argv = argv_of(config)
    lookup(argv)
    entry = _entry(store)
    os.chmod(entry, 0o620)
    assert lookup(argv)[1] == 1
    assert lookup(argv)[1] == 0
    if os.geteuid() == 0:
        os.chown(_entry(store), 1, -1)
        assert lookup(argv)[1] == 1


@pytest.mark.parametrize("damage", [b"", b"{", b"[]", b'{"format": 1}', b"\xff" * 100])
def test_a_damaged_entry_is_a_miss(store, config, damage):
    argv = argv_of(config)
    lookup(argv)
    _entry(store).write_bytes(damage)
    assert lookup(argv)[1] == 1
    assert lookup(argv)[1] == 0


def test_an_entry_of_another_answer_is_a_miss(store, config):
    """Each answer carries its key: a stale entry that proves its files cannot be used for
    another command line (an entry renamed over another's)."""
    one, two = argv_of(config, "Port=1"), argv_of(config, "Port=2")
    lookup(one)
    first = _entry(store)
    lookup(two)
    (second,) = [p for p in store.iterdir() if p != first]
    os.replace(first, second)
    out, runs = lookup(two)
    assert runs == 1 and out is not None and b"port 2" in out


def test_the_cap_holds(store, config, monkeypatch):
    monkeypatch.setattr(sshgcache, "MAX_ENTRIES", 8)
    for port in range(1, 13):
        lookup(argv_of(config, f"Port={port}"))
        assert len(os.listdir(store)) <= 8
    assert lookup(argv_of(config, "Port=12"))[1] == 0  # the newest stays
    # entries another process wrote count too, once this one lists the directory
    sshgcache._counted.clear()
    for n in range(20):
        other = store / f"{sshgcache.PREFIX}{n:064x}"
        other.write_bytes(b"{}")
        os.utime(other, (time.time() - 60, time.time() - 60))
    lookup(argv_of(config, "Port=13"))
    assert len(os.listdir(store)) <= 8
    assert lookup(argv_of(config, "Port=13"))[1] == 0


def test_off_when_asked(store, config, monkeypatch):
    monkeypatch.setenv(sshgcache.CACHE_ENV, "0")
    argv = argv_of(config)
    assert lookup(argv)[1] == 1 and lookup(argv)[1] == 1
    assert not store.exists()


def test_resolved_all_goes_through_the_store(store, config):
    host_argv = [str(SSH), "-F", str(config), "--", "web1"]
    first = sshcmd.resolved_all(host_argv)
    assert first["user"] == ["alice"] and len(os.listdir(store)) == 1
    assert sshcmd.resolved_all(host_argv) == first


def test_a_hit_costs_well_under_a_millisecond(store, config):
    argv = argv_of(config)
    lookup(argv)
    run = Counted()
    n = 200
    started = time.process_time()
    for _ in range(n):
        sshgcache.lookup(argv, run)
    per = (time.process_time() - started) / n
    assert run.runs == 0
    assert per < 0.001, f"a hit took {per * 1e6:.0f} us of CPU"
