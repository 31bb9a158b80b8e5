"""A login with an OpenSSH user certificate signed by the lab's CA (every node's sshd has
TrustedUserCAKeys), offered through ssh_config's CertificateFile, by a key the node does not
authorize: only the certificate can let it in, and the node's own sshd log names the certificate it
accepted. An expired certificate, or one for another login name, or signed by a CA the node does not
trust, is refused with an error naming the host and the certificate's fault. On every transport
there is (FLEETOPS_TRANSPORT)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import run_fab, ssh_masters

from fleetops.lab import Lab
from fleetops.lab.keys import certify, fingerprint, keygen
from fleetops.wire import masters

# The transports this checkout has: paramiko always, OpenSSH's where its connector is.
TRANSPORTS = ["paramiko"] + (
    ["openssh"] if importlib.util.find_spec("fleetops.wire.openssh") else []
)
ACCEPTED_CERT = "Accepted publickey for {user} from 127.0.0.1 port"


@pytest.fixture
def cert_login(lab: Lab, tmp_path: Path) -> Iterator[dict]:
    """lab01's sshd with the config lab.up writes (TrustedUserCAKeys the lab's CA), a key of the
    test's own that no authorized_keys names, an inventory with that key, and a control directory
    for masters."""
    node = lab.node("lab01")
    lab.configure_sshd(node)
    assert f"TrustedUserCAKeys {lab.user_ca}.pub" in node.config.read_text()
    key = tmp_path / "ops_key"
    keygen(key, "fleetops-cert-test")
    assert (
        key.with_suffix(".pub").read_text().split()[1]
        not in (node.dir / "authorized_keys").read_text()
    )
    inventory = yaml.safe_load(lab.hosts_file.read_text())
    inventory["defaults"]["identity_file"] = str(key)
    inventory["hosts"] = {"lab01": inventory["hosts"]["lab01"]}
    hosts = tmp_path / "cert.yaml"
    hosts.write_text(yaml.safe_dump(inventory))
    cm_dir = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    try:
        yield {"node": node, "key": key, "hosts": hosts, "dir": tmp_path, "cm": cm_dir}
    finally:
        masters.close_all(str(cm_dir), masters.masters(str(cm_dir)))
        assert not ssh_masters(cm_dir)
        shutil.rmtree(cm_dir, ignore_errors=True)


def ping(lab: Lab, setup: dict, transport: str, certificate: Path | None) -> tuple[int, dict, str]:
    config = setup["dir"] / "ssh_config"
    config.write_text(f"Host *\n  CertificateFile {certificate}\n" if certificate else "")
    proc = run_fab(
        lab.root,
        "-H",
        "lab01",
        "ping",
        "--json",
        timeout=120,
        env={
            "FLEETOPS_INVENTORY": str(setup["hosts"]),
            "FLEETOPS_SSH_CONFIG": str(config),
            "FLEETOPS_TRANSPORT": transport,
            "FLEETOPS_CONTROL_DIR": str(setup["cm"]),
        },
        drop=("SSH_AUTH_SOCK",),
    )
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    try:
        return proc.returncode, json.loads(proc.stdout), both
    except ValueError:
        raise AssertionError(f"no JSON: rc={proc.returncode}\n{both}") from None


def sshd_log_after(node, offset: int) -> str:
    return (node.dir / "sshd.log").read_text(errors="replace")[offset:]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_certificate_signed_by_the_lab_ca_logs_in_where_the_bare_key_cannot(
    lab, cert_login, transport
):
    node = cert_login["node"]
    cert = lab.certify(
        cert_login["key"].with_suffix(".pub"), cert_login["dir"] / "ops.cert", "ops-cert-ok"
    )

    start = len((node.dir / "sshd.log").read_text(errors="replace"))
    code, doc, both = ping(lab, cert_login, transport, None)
    assert code == 4, both  # the bare key: not authorized
    assert ACCEPTED_CERT.format(user=lab.user) not in sshd_log_after(node, start)

    start = len((node.dir / "sshd.log").read_text(errors="replace"))
    code, doc, both = ping(lab, cert_login, transport, cert)
    assert code == 0, both
    accepted = [
        line
        for line in sshd_log_after(node, start).splitlines()
        if line.startswith(ACCEPTED_CERT.format(user=lab.user))
    ]
    assert accepted and all(
        "ED25519-CERT" in line and "ID ops-cert-ok" in line for line in accepted
    ), accepted


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("fault", ["expired", "principal", "untrusted"])
def test_a_refused_certificate_is_named_with_its_fault(lab, cert_login, transport, fault):
    pub = cert_login["key"].with_suffix(".pub")
    if fault == "expired":
        cert = lab.certify(
            pub, cert_login["dir"] / "old.cert", "ops-cert-old", validity="20200101:20200102"
        )
        said = "expired"
    elif fault == "principal":
        cert = lab.certify(
            pub, cert_login["dir"] / "other.cert", "ops-cert-other", principals=["someone-else"]
        )
        said = f"not valid for user {lab.user}"
    else:  # sound, but signed by a CA no node trusts
        rogue = cert_login["dir"] / "rogue_ca"
        keygen(rogue, "not-the-lab-ca")
        cert = certify(rogue, pub, cert_login["dir"] / "rogue.cert", "ops-cert-rogue", [lab.user])
        said = f"check that the node's sshd trusts its CA ({fingerprint(rogue.with_suffix('.pub'))}"
    code, doc, both = ping(lab, cert_login, transport, cert)
    assert code == 4, both
    (result,) = doc["results"]
    assert result["host"] == "lab01" and result["status"] == "unreachable"
    assert str(cert) in result["msg"] and said in result["msg"], result["msg"]
