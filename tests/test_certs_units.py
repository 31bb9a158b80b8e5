"""OpenSSH certificates read as sshd reads them: what ssh-keygen signed (each key type, user and
host, principals, validity) is what fleetops.wire.certs reads back, and a certificate's fault for a
login is named from it."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetops.wire import certs

pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen"
)


def keygen(path: Path, kind: str = "ed25519") -> Path:
    # RSA at 2048 bits rather than ssh-keygen's 3072: the certificate reads back the same, and the
    # key is made in a tenth of the time.
    size = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *size, "-N", "", "-f", str(path)], check=True)
    return path


def sign(ca: Path, key: Path, *args: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "id-" + key.name, *args, f"{key}.pub"],
        check=True,
        capture_output=True,
    )
    return Path(f"{key}-cert.pub")


def ca_fingerprint(ca: Path) -> str:
    return subprocess.run(
        ["ssh-keygen", "-lf", f"{ca}.pub"], capture_output=True, text=True
    ).stdout.split()[1]


@pytest.mark.parametrize("kind", ["ed25519", "rsa", "ecdsa"])
def test_a_user_certificate_reads_back_as_signed(tmp_path, kind):
    ca, key = keygen(tmp_path / "ca"), keygen(tmp_path / "id", kind)
    cert = certs.read(str(sign(ca, key, "-n", "ops,root", "-z", "42", "-V", "20300101:20300201")))
    assert cert is not None and cert.key_type.endswith("-cert-v01@openssh.com")
    assert (cert.kind, cert.serial, cert.key_id, cert.principals) == (
        1,
        42,
        "id-id",
        ("ops", "root"),
    )
    # ssh-keygen -V reads local time
    assert cert.valid_after == int(dt.datetime(2030, 1, 1).timestamp())
    assert cert.valid_before == int(dt.datetime(2030, 2, 1).timestamp())
    assert cert.ca_fingerprint == ca_fingerprint(ca)


def test_each_fault_is_named(tmp_path):
    ca, key = keygen(tmp_path / "ca"), keygen(tmp_path / "id")
    now = dt.datetime(2031, 6, 1).timestamp()
    expired = certs.read(str(sign(ca, key, "-n", "ops", "-V", "20300101:20300201")))
    assert expired is not None and certs.fault(expired, "ops", now).startswith("expired on 2030-0")
    future = certs.read(str(sign(ca, key, "-n", "ops", "-V", "20320101:20330101")))
    assert future is not None
    start = dt.datetime.fromtimestamp(future.valid_after, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
    assert certs.fault(future, "ops", now) == f"is not valid before {start}"
    other = certs.read(str(sign(ca, key, "-n", "someone,else")))
    assert other is not None
    assert (
        certs.fault(other, "ops", now)
        == "is not valid for user ops (its principals: someone, else)"
    )
    assert certs.fault(other, "else", now) is None and certs.validity(other) == "always to forever"
    anyone = certs.read(str(sign(ca, key)))
    assert anyone is not None and "names no principal" in certs.fault(anyone, "ops", now)
    host = certs.read(str(sign(ca, key, "-h", "-n", "node1")))
    assert (
        host is not None
        and host.kind == 2
        and "host certificate" in certs.fault(host, "node1", now)
    )


def test_what_is_not_a_certificate_reads_as_none(tmp_path):
    key = keygen(tmp_path / "id")
    assert certs.read(f"{key}.pub") is None  # a plain public key
    (tmp_path / "junk").write_text("ssh-ed25519-cert-v01@openssh.com AAAA%%%\n")
    assert certs.read(str(tmp_path / "junk")) is None
    assert certs.read(str(tmp_path / "missing")) is None
    assert certs.parse(b"\x00\x00\x00\x20ssh-ed25519-cert-v01@openssh.com\x00") is None  # truncated


def test_a_refused_login_names_the_first_certificate_and_its_fault(tmp_path):
    ca, key = keygen(tmp_path / "ca"), keygen(tmp_path / "id")
    old = sign(ca, key, "-n", "ops", "-V", "20200101:20200102").rename(tmp_path / "old.cert")
    good = sign(ca, key, "-n", "ops").rename(tmp_path / "good.cert")
    said = certs.refused_login(
        "web1 (10.0.0.9:22)", "ops", [str(tmp_path / "missing"), str(old), str(good)]
    )
    assert said is not None and said.startswith(
        f"web1 (10.0.0.9:22): authentication failed for user 'ops': "
        f"the certificate {old} expired on 2020-01-02"
    )
    said = certs.refused_login("web1", "ops", [str(good)])
    assert (
        said is not None
        and f"the certificate {good} (valid always to forever for ops) was refused" in said
    )
    assert ca_fingerprint(ca) in said and "TrustedUserCAKeys" in said
    assert certs.refused_login("web1", "ops", [f"{key}.pub"]) is None
