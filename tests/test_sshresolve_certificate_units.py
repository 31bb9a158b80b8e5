"""ssh_config's CertificateFile: the connection offers the identity key with that OpenSSH user
certificate (signed here by a CA of the test's own with ssh-keygen), not the bare key; a certificate
for another key is not attached. Nothing is opened."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.plans.inventory import plain_host
from fleetops.wire import fabconfig, ssh

pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None or shutil.which("ssh") is None,
    reason="needs OpenSSH's ssh and ssh-keygen",
)


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    saved = (fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS)
    yield tmp_path / "ssh_config"
    fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS = saved
    fabconfig._RESOLVED.clear()


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def signed(ca: Path, key: Path, where: Path) -> Path:
    """The user certificate for `key`, moved away from `key`-cert.pub so only CertificateFile can
    name it."""
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "fleet-test", "-n", "ops", f"{key}.pub"],
        check=True,
    )
    Path(f"{key}-cert.pub").rename(where)
    return where


def test_certificatefile_is_offered_with_the_key_it_certifies(config, tmp_path):
    ca, key, other = keygen(tmp_path / "ca"), keygen(tmp_path / "id"), keygen(tmp_path / "other")
    cert = signed(ca, key, tmp_path / "login.cert")
    config.write_text(
        f"Host c\n  HostName 127.0.0.1\n  User ops\n  IdentityFile {other}\n  IdentityFile {key}\n"
        f"  CertificateFile {cert}\nHost wrong\n  IdentityFile {other}\n  CertificateFile {cert}\n"
    )
    ssh.use_ssh_config(str(config))
    pkey = ssh._fabric_connection(plain_host("c"), None).connect_kwargs["pkey"]
    assert (
        pkey.public_blob is not None
        and pkey.public_blob.key_type == "ssh-ed25519-cert-v01@openssh.com"
    )
    # the certified key, not `other`
    assert pkey.get_base64() == Path(f"{key}.pub").read_text().split()[1]
    wrong = ssh._fabric_connection(plain_host("wrong"), None).connect_kwargs
    # a certificate for another key: not joined
    assert getattr(wrong.get("pkey"), "public_blob", None) is None
