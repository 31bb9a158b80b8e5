"""Both transports' check of a file a `become` host's fetch is about to read by path over SFTP
(wire/sftp.check_read_path), against OpenSSH's own sftp-server run here on pipes (the server a
node's sshd starts for `ssh -s sftp`, without the SSH around it), on real directories: read only
through directories root and the login user alone may change, each directory asked once per
connection; and what a read the login user may not make says under become."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.plans.inventory import Host
from fleetops.wire.connector import TransportError
from fleetops.wire.sftp import ReadPathSeen, check_read_path, denied_hint
from fleetops.wire.sftpproto import SFTPClient, over_pipes

SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/sftp-server",
)
HOST = Host(name="n1", address="127.0.0.1", user="ops", become="sudo")


@pytest.fixture
def sftp(tmp_path: Path) -> Iterator[SFTPClient]:
    server = next((s for s in SERVERS if os.access(s, os.X_OK)), shutil.which("sftp-server"))
    assert server is not None, "OpenSSH's sftp-server (openssh-server, scripts/setup installs it)"
    proc = subprocess.Popen(
        [server, "-d", str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield over_pipes(proc.stdin, proc.stdout)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    (tmp_path / "out" / "sub").mkdir(parents=True)
    for folder in (tmp_path / "out", tmp_path / "out" / "sub"):
        folder.chmod(0o755)
    (tmp_path / "out" / "sub" / "file.txt").write_text("x")
    return tmp_path


def test_a_file_under_trusted_directories_is_read_each_directory_asked_once(sftp, tree):
    seen = ReadPathSeen()
    check_read_path(sftp, HOST, str(tree / "out" / "sub" / "file.txt"), seen)
    assert seen.login_uid == os.getuid()  # the owner of the server's start directory
    assert {str(tree / "out"), str(tree / "out" / "sub")} <= set(seen.directories)
    assert str(tree / "out" / "sub" / "file.txt") not in seen.directories  # files are asked anew
    # kept for the connection: a second file in the same directory is judged from those answers
    (tree / "out" / "sub").chmod(0o777)
    check_read_path(sftp, HOST, str(tree / "out" / "sub" / "file.txt"), seen)
    with pytest.raises(TransportError) as fresh:
        check_read_path(sftp, HOST, str(tree / "out" / "sub" / "file.txt"), ReadPathSeen())
    assert fresh.value.kind == "remote"


def test_a_directory_others_may_write_on_the_way_is_refused_and_nothing_read(sftp, tree):
    (tree / "out").chmod(0o777)
    with pytest.raises(TransportError) as err:
        check_read_path(sftp, HOST, str(tree / "out" / "sub" / "file.txt"), ReadPathSeen())
    text = str(err.value)
    assert err.value.kind == "remote"
    assert text.startswith(f"n1: refusing to read {tree}/out/sub/file.txt as ops: ") and (
        text.endswith("; nothing read")
    ), text
    assert str(tree / "out") in text and "0777" in text, text


def test_a_file_gone_since_the_node_listed_it_is_said_so(sftp, tree):
    with pytest.raises(TransportError) as err:
        check_read_path(sftp, HOST, str(tree / "out" / "sub" / "nosuchfile"), ReadPathSeen())
    assert "does not exist on the node (it changed since the node listed it)" in str(err.value)


def test_a_denied_read_says_why_only_under_become():
    assert denied_hint(Host(name="n1", address="127.0.0.1", user="ops")) == ""
    hint = denied_hint(HOST)
    assert "fleetops never reads files as root over SFTP" in hint
    assert "make them readable by ops" in hint and hint.startswith(" (") and hint.endswith(")")
