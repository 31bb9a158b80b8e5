"""Per-connection work that grew with the fleet, or was done again
for every host, is done once and still gives the same answers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import paramiko

from fleetops.wire import ssh


def _known_hosts(tmp_path: Path, hosts: int) -> tuple[Path, list[paramiko.PKey]]:
    keys = [paramiko.Ed25519Key.from_private_key_file(str(_key(tmp_path, i))) for i in range(3)]
    lines = []
    for i in range(hosts):
        key = keys[i % 3]
        lines.append(f"[127.0.0.1]:{40000 + i} {key.get_name()} {key.get_base64()}")
    hashed = paramiko.HostKeys.hash_host("[127.0.0.1]:40007")
    # hashed, before the plain one
    lines.insert(3, f"{hashed} {keys[2].get_name()} {keys[2].get_base64()}")
    # one entry, two names
    lines.append(f"gpu01,10.0.0.1 {keys[1].get_name()} {keys[1].get_base64()}")
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    return path, keys


def _key(tmp_path: Path, i: int) -> Path:
    path = tmp_path / f"id{i}"
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_indexed_known_hosts_answer_as_paramiko_does_without_scanning_every_entry(
    tmp_path, monkeypatch
):
    path, _ = _known_hosts(tmp_path, 300)
    plain, indexed = paramiko.HostKeys(str(path)), ssh._IndexedHostKeys(str(path))
    names = [
        "[127.0.0.1]:40000",
        "[127.0.0.1]:40007",
        "[127.0.0.1]:40299",
        "gpu01",
        "10.0.0.1",
        "nobody",
        "[127.0.0.1]:49999",
    ]
    for name in names:
        want, got = plain.lookup(name), indexed.lookup(name)
        assert (want is None) == (got is None), name
        if want is not None:
            assert list(want.keys()) == list(got.keys()), name
            assert all(want[k] == got[k] for k in want), name
    checked: list[str] = []
    original = paramiko.HostKeys._hostname_matches
    monkeypatch.setattr(
        paramiko.HostKeys,
        "_hostname_matches",
        lambda self, host, entry: checked.append(host) or original(self, host, entry),
    )
    indexed.lookup("[127.0.0.1]:40150")
    # its own entry and the hashed one, not all 302 (paramiko's scan)
    assert len(checked) <= 3, len(checked)


def test_a_key_added_after_the_index_was_built_is_found(tmp_path):
    path, keys = _known_hosts(tmp_path, 5)
    indexed = ssh._IndexedHostKeys(str(path))
    assert indexed.lookup("newhost") is None
    indexed.add("newhost", keys[0].get_name(), keys[0])
    assert indexed.lookup("newhost")[keys[0].get_name()] == keys[0]


def test_the_identity_key_is_loaded_once_per_file_version(tmp_path):
    key = _key(tmp_path, 9)
    first = ssh._identity_key(str(key), None)
    assert isinstance(first, paramiko.PKey)
    assert ssh._identity_key(str(key), None) is first  # the same object: loaded once
    # paramiko then reports it, as before
    assert ssh._identity_key(str(tmp_path / "missing"), None) is None
    (tmp_path / "garbage").write_text("not a key\n")
    assert ssh._identity_key(str(tmp_path / "garbage"), None) is None


def test_aead_ciphers_are_asked_for_first_and_every_other_cipher_stays_offered():
    import socket

    ours, other = socket.socketpair()
    try:
        offered = ssh._FleetTransport(ours).get_security_options().ciphers
        stock = paramiko.Transport(other).get_security_options().ciphers
    finally:
        ours.close()
        other.close()
    assert offered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert sorted(offered) == sorted(stock)  # a server without GCM still connects


class _CountingEntries(list):
    """known_hosts entries that count how many times any code walks over one of them."""

    touched = 0
    delay = 0.0

    def __iter__(self):
        for entry in super().__iter__():
            self.touched += 1
            yield entry

    def __getitem__(self, index):
        got = super().__getitem__(index)
        time.sleep(self.delay)
        self.touched += len(got) if isinstance(index, slice) else 1
        return got


def _loaded_counting(path: Path) -> tuple[ssh._IndexedHostKeys, _CountingEntries]:
    indexed = ssh._IndexedHostKeys()
    indexed._entries = entries = _CountingEntries()
    indexed.load(str(path))
    return indexed, entries


def test_loading_a_fleet_sized_known_hosts_indexes_each_entry_once(tmp_path):
    """Found at 800 hosts: paramiko's load() looks every line up before adding it, and each lookup
    rebuilt the whole index (one more entry each time): O(n²), 0.49 s of start-up for an 800-host
    known_hosts."""
    path, _ = _known_hosts(tmp_path, 400)
    indexed, entries = _loaded_counting(path)
    assert len(entries) == 402
    assert entries.touched <= 2 * len(entries), entries.touched  # the old rebuilds walked ~80,000
    assert indexed.lookup("[127.0.0.1]:40399") is not None and indexed.lookup("gpu01") is not None


def test_every_connection_looking_up_at_once_indexes_new_entries_once(tmp_path):
    """Found by profiling N=128: 32 connections starting together each built the index (129 builds
    per run). Keys added after loading are indexed by one lookup while the others wait, however many
    look up at once (each entry's walk is slowed down here, so that every thread arrives while the
    first is indexing)."""
    import threading

    path, keys = _known_hosts(tmp_path, 200)
    indexed, entries = _loaded_counting(path)
    # indexes the file's last line: load() adds it after its last lookup
    assert indexed.lookup("gpu01") is not None
    for i in range(50):
        indexed.add(f"[127.0.0.1]:{50000 + i}", keys[0].get_name(), keys[0])
    entries.touched, entries.delay = 0, 0.002
    threads = [
        threading.Thread(target=indexed.lookup, args=(f"[127.0.0.1]:{50000 + i}",))
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the 50 new ones, once; not the whole file, not per thread
    assert entries.touched == 50, entries.touched
    assert indexed.lookup("[127.0.0.1]:50049")[keys[0].get_name()] == keys[0]
