"""become: the node agent as root through sudo, for a login user who may not write the venv (docs/become.md).

The agent runs as `sudo -n -- python -I -S -c BOOTSTRAP --ready ...` (`sudo -S -p PROMPT` with
--ask-become-pass). The bootstrap's first line says the interpreter runs ({"ready": true}); until it comes, the
client sends nothing but the password, and that only in answer to sudo's own prompt on stderr, once: a second
prompt is a wrong password. The password never appears in argv, the environment, evidence or the audit log.

The zip is not uploaded over SFTP (that would be the login user's file, run by root): it goes on stdin to
`bootstrap --install-agent`, which writes it into root's state dir only if its sha256 is the client's."""

from __future__ import annotations

import json
import select
import time

import paramiko

from remote_scripts.core.bootstrap import INSTALL, READY

from ..plans.inventory import Host
from ..results import Evidence
from .connector import ExecResult, TransportError
from .session import Overflow, drain

PROMPT = "[fleetops-become-password]"
READY_LINE = b'{"ready": true}'
MAX_HANDSHAKE_BYTES = 64 * 1024  # what sudo and the first line may take before the agent is ready


def sudo_words(password: str | None) -> list[str]:
    """sudo's own words in front of the agent's command: -n (never ask) unless a password was typed."""
    return ["sudo", "-S", "-p", PROMPT, "--"] if password is not None else ["sudo", "-n", "--"]


def agent_words(words: list[str]) -> list[str]:
    """The bootstrap's argv words under become: --ready first."""
    return [READY, *words]


def install_words(state_dir: str, path: str, sha256: str) -> list[str]:
    return [READY, INSTALL, state_dir, path, sha256]


def handshake(chan: paramiko.Channel, host: Host, password: str | None, shown: str, timeout: float) -> bytes:
    """Wait for the bootstrap's ready line, answering sudo's prompt with the password once. Returns the stdout
    that followed the ready line (the agent's, kept for its session). Raises TransportError naming sudo's
    refusal (no sudoers entry, a password needed, a wrong one)."""
    started = time.monotonic()
    deadline = started + timeout
    out, err = bytearray(), bytearray()
    sent = False
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        newline = out.find(b"\n")
        if newline >= 0:
            if bytes(out[:newline]).strip() == READY_LINE:
                return bytes(out[newline + 1:])
            chan.close()
            raise TransportError("remote", f"{host.name}: the agent started through sudo did not say it was ready "
                                           "(its first line was something else); nothing was sent to it",
                                 _evidence(shown, None, err, started))
        prompts = err.decode("utf-8", "replace").count(PROMPT)
        if prompts > 1 or (prompts and password is None):
            chan.close()
            raise TransportError("auth", f"{host.name}: sudo did not accept the become password for "
                                         f"{host.user or 'the login user'}; check it and run again (nothing ran "
                                         "as root)", _evidence(shown, None, err, started))
        if prompts == 1 and not sent and password is not None:
            chan.sendall((password + "\n").encode())
            sent = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            code = chan.recv_exit_status()
            chan.close()
            raise refused(host, code, err, shown, started)
        if len(out) + len(err) > MAX_HANDSHAKE_BYTES:
            chan.close()
            raise TransportError("remote", f"{host.name}: sudo and the agent sent more than "
                                           f"{MAX_HANDSHAKE_BYTES} bytes before the agent was ready; nothing was "
                                           "sent to it", _evidence(shown, None, err, started))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            chan.close()
            raise TransportError("timeout", f"{host.name}: the agent did not start through sudo within "
                                            f"{timeout:.0f}s (sudo waiting for something?); nothing ran",
                                 _evidence(shown, None, err, started))
        select.select([chan], [], [], min(remaining, 0.5))


def install(chan: paramiko.Channel, host: Host, password: str | None, shown: str, data: bytes) -> None:
    """The zip on stdin of `bootstrap --install-agent` run by root (chan: its channel, just started)."""
    started = time.monotonic()
    try:
        handshake(chan, host, password, shown, host.connect_timeout + 50)
        chan.sendall(data)
        chan.shutdown_write()
        out, err, code = drain(chan, started + 300)
    except (OSError, EOFError, paramiko.SSHException, TimeoutError, Overflow) as exc:
        raise TransportError("lost", f"{host.name}: installing the agent as root stopped ({exc or 'EOF'}); run "
                                     "again", Evidence(shown, None, [], 0.0)) from None
    evidence = ExecResult(shown, code, out, err, time.monotonic() - started).evidence()
    try:
        answer = json.loads(out.decode("utf-8").splitlines()[0])
    except (ValueError, UnicodeDecodeError, IndexError):
        answer = {}
    if not isinstance(answer, dict) or answer.get("installed") is not True:
        why = (answer.get("error") if isinstance(answer, dict) else None) or \
            f"installing the agent as root failed (exit {code})"
        raise TransportError("untrusted", f"{host.name}: {why}", evidence)


def refused(host: Host, code: int, err: bytes | bytearray, shown: str, started: float) -> TransportError:
    """sudo (or the node's shell) ended before the agent ran: its reason and the next step."""
    text = err.decode("utf-8", "replace").replace(PROMPT, "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("sudo")), lines[-1] if lines else f"exit {code}")
    user = host.user or "the login user"
    if code == 127:
        step = "install sudo on the node, or leave out become: for this host"
    elif host.python in text and ("command not found" in text or "No such file" in text):
        step = f"the target python {host.python} was not found on the node: check this host's `python:`"
    elif "password is required" in text:
        step = (f"give {user} a sudoers entry with NOPASSWD for {host.python}, or run with --ask-become-pass "
                "to type sudo's password")
    else:
        step = f"give {user} a sudoers entry that lets it run {host.python} as root (sudo -l -U {user} shows it)"
    return TransportError("auth", f"{host.name}: sudo would not run the agent as root for {user} ({said}); {step}; "
                                  "nothing ran as root", _evidence(shown, code, err, started))


def _evidence(shown: str, code: int | None, err: bytes | bytearray, started: float) -> Evidence:
    lines = err.decode("utf-8", "replace").replace(PROMPT, "").splitlines()[-20:]
    return Evidence(shown, code, [line for line in lines if line.strip()], round(time.monotonic() - started, 3))
