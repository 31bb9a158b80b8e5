"""An ssh_config ProxyJump whose jump host is on the target's own HostName (another port: another
sshd) is a real hop against the lab's sshd nodes: the jump host's sshd logs the login, never skipped
for a direct connection; a loop in ssh_config is refused with a clear error, exit 4, no
traceback."""

from __future__ import annotations

import json

import pytest
from conftest import run_fab
from sshhome import home_with, logged_since

pytestmark = pytest.mark.lab


def test_a_jump_host_on_the_targets_hostname_is_gone_through_and_a_loop_is_refused(lab, tmp_path):
    target, jump = lab.node("lab01"), lab.node("lab02")
    keys = f"  IdentityFile {lab.client_key}\n  UserKnownHostsFile {lab.known_hosts}\n"
    config = (
        f"Host 127.0.0.1\n{keys}"
        f"Host labvia\n  HostName 127.0.0.1\n  Port {target.port}\n  User {lab.user}\n{keys}"
        f"  ProxyJump {lab.user}@127.0.0.1:{jump.port}\n"
        f"Host loopa\n  HostName 127.0.0.1\n  Port {target.port}\n  ProxyJump loopb\n"
        f"Host loopb\n  HostName 127.0.0.1\n  Port {jump.port}\n  ProxyJump loopa\n"
    )
    home = home_with(tmp_path, lab, config)
    log = jump.dir / "sshd.log"
    before = log.stat().st_size
    proc = run_fab(lab.root, "-H", "labvia", "ping", "--json", env={"HOME": str(home)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logged = logged_since(log, before)
    # the hop's own sshd
    assert f"Accepted publickey for {lab.user} from 127.0.0.1" in logged, logged
    proc = run_fab(lab.root, "-H", "loopa", "ping", "--json", env={"HOME": str(home)}, timeout=300)
    assert proc.returncode == 4 and "Traceback" not in proc.stdout + proc.stderr, (
        proc.stdout + proc.stderr
    )
    msg = json.loads(proc.stdout)["results"][0]["msg"]
    assert "ssh_config ProxyJump loop" in msg and "RecursionError" not in msg, msg
