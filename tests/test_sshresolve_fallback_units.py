"""Without an `ssh` binary, ssh_config is read by paramiko, and one warning names every directive that reading
does not apply (never silently); with one, there is nothing to warn about. Nothing is opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.plans.inventory import plain_host
from fleetops.wire import fabconfig, ssh

CONFIG = ("Host far\n  HostName 127.0.0.7\n  User ops\n  ForwardAgent yes\n  ProxyCommand nc %h %p\n"
          "Host *\n  ServerAliveInterval 30\n  GSSAPIAuthentication yes\n")


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    saved = (fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS)
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG)
    yield path
    fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS = saved
    fabconfig._use_resolver(*fabconfig._ssh_config(fabconfig._SSH_CONFIG_PATH))


def test_without_ssh_paramiko_reads_it_and_one_warning_names_what_it_leaves_out(config, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a directory with no `ssh` in it
    ssh.use_ssh_config(str(config))
    warning = ssh.fallback_warning()
    assert warning is not None and "no `ssh` on PATH" in warning, warning
    assert "ForwardAgent, ServerAliveInterval, GSSAPIAuthentication" in warning, warning
    cxn = ssh._fabric_connection(plain_host("far"), None)
    assert (cxn.host, cxn.user, cxn.gateway) == ("127.0.0.7", "ops", "nc 127.0.0.7 22")


def test_with_ssh_there_is_no_warning_and_ssh_resolves(config):
    ssh.use_ssh_config(str(config))
    assert ssh.fallback_warning() is None
    cxn = ssh._fabric_connection(plain_host("far:2201"), None)
    assert (cxn.host, cxn.user, int(cxn.port), cxn.gateway) == ("127.0.0.7", "ops", 2201, "nc 127.0.0.7 2201")
