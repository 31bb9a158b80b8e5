"""Without an `ssh` binary, ssh_config is read by paramiko, and one warning names every directive
that reading does not apply (never silently); with one, there is nothing to warn about, and `ssh -G`
is asked once per host word per run. Nothing is opened."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.plans.inventory import plain_host
from fleetops.wire import fabconfig, ssh

CONFIG = (
    "Host far\n  HostName 127.0.0.7\n  User ops\n  ForwardAgent yes\n  ProxyCommand nc %h %p\n"
    "Host *\n  ServerAliveInterval 30\n  GSSAPIAuthentication yes\n"
)


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    saved = (fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS)
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG)
    yield path
    # the previous path put back: its files are read again on the next use
    fabconfig._CONFIG, fabconfig._SSH_CONFIG_PATH, fabconfig._PLAIN_KEYS = saved


def test_without_ssh_paramiko_reads_it_and_one_warning_names_what_it_leaves_out(
    config, tmp_path, monkeypatch
):
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
    assert (cxn.host, cxn.user, int(cxn.port), cxn.gateway) == (
        "127.0.0.7",
        "ops",
        2201,
        "nc 127.0.0.7 2201",
    )


def test_each_host_word_is_resolved_once_per_run_with_the_file_and_the_values_as_options(
    config, tmp_path, monkeypatch
):
    """A real `ssh` behind a wrapper that logs its argv: one `ssh -G` per word and values in a run,
    `-F` the run's file, the user and port as `-o`, the word after `--`; a new run asks again."""
    real = shutil.which("ssh")
    assert real is not None
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ssh.use_ssh_config(str(config))
    for word in ("far", "far", "ops@far:2201", "ops@far:2201", "near"):
        ssh._fabric_connection(plain_host(word), None)
    assert log.read_text().splitlines() == [
        f"-G -F {config} -- far",
        f"-G -F {config} -o User=ops -o Port=2201 -- far",
        f"-G -F {config} -- near",
    ]
    ssh.use_ssh_config(str(config))  # the next run
    ssh._fabric_connection(plain_host("far"), None)
    assert log.read_text().splitlines()[-1] == f"-G -F {config} -- far"
    assert len(log.read_text().splitlines()) == 4
