"""become: the node agent as root through sudo, for a login user who may not write the venv
(docs/become.md).

The agent runs as `sudo -n -- python -I -S -c BOOTSTRAP --ready ...`. With --ask-become-pass the
channel runs `/bin/sh -c SCRIPT` instead (VALIDATE): first `sudo -S -v`, which runs no command at
all and reads its prompt from SUDO_PROMPT, a random string made for this channel and sent as the
first line of stdin (never in argv, where any user's `ps` would show it); then a marker line on
stderr; then `sudo -n -- python ...`, which finds the credential `sudo -v` left for this shell. The
password is written only in answer to that random prompt and only before the marker, once: anything
asking afterwards (the target python itself, on a NOPASSWD entry) is refused and never answered. The
password never appears in argv, the environment, evidence or the audit log.

The bootstrap's first line says the interpreter runs ({"ready": true}); until it comes, the client
sends the agent nothing.

The zip is not uploaded over SFTP (that would be the login user's file, run by root): when the
bootstrap finds no agent it asks for it ("send_agent"), and the zip goes on the same channel's stdin
(frame()); the bootstrap writes it into root's state dir only if its sha256 is the client's, then
runs it. So one sudo per host and run, also on the first visit of an agent version: the password is
sent once, and a later channel of the same run that needs it again (Sudo(spent=True)) is refused,
never answered."""

from __future__ import annotations

import secrets
import select
import time
from typing import TYPE_CHECKING

from ..agent.core.bootstrap import AGENT_FRAME, READY
from ..plans.inventory import Host
from ..results import Evidence
from .connector import TransportError

if TYPE_CHECKING:
    from .session import Channel

READY_LINE = b'{"ready": true}'
MAX_HANDSHAKE_BYTES = 64 * 1024  # what sudo and the first line may take before the agent is ready
# stderr's line between `sudo -v` and the command: from here on nothing is sudo's prompt
VALIDATED = "[fleetops: sudo -v done]"
# `sudo -v` in a subshell that ends with it (the prompt lives nowhere else), then the command with
# the credential it left: both sudo runs are children of this shell, which is what sudo's credential
# is tied to when there is no terminal. Not `exec sudo -n`: its parent would then be sshd, not this
# shell. The python is "$1"; sudo's secure_path replaces the login PATH, which python gets as an -X
# option (the agent looks for nvidia-smi there: remote_scripts/health/gpu.py).
RUN = 'p=$1; shift; {sudo} "$p" "-Xfleetops_login_path=$PATH" "$@"'
NO_PASSWORD = RUN.format(sudo="exec sudo -n --")
VALIDATE = (
    '(IFS= read -r p && SUDO_PROMPT="$p" && export SUDO_PROMPT && exec sudo -S -v) && '
    f'printf "%s\\n" "{VALIDATED}" >&2 && {{ ' + RUN.format(sudo="sudo -n --") + "; }"
)


class Sudo:
    """How one channel runs its command through sudo: `sudo -n` (never asking) without a password;
    with one, VALIDATE and this channel's own random prompt (`nonce`)."""

    def __init__(self, password: str | None, spent: bool = False) -> None:
        """spent: this run already sent the password to this host; it is never sent again (`sudo
        -n`)."""
        self.spent = spent
        self.password = None if spent else password
        self.nonce = (
            f"[sudo password {secrets.token_hex(16)}]" if self.password is not None else None
        )

    def argv(self, command: list[str]) -> list[str]:
        return [
            "exec",
            "/bin/sh",
            "-c",
            NO_PASSWORD if self.password is None else VALIDATE,
            "fleetops-become",
            *command,
        ]

    def shown(self, command: str) -> str:
        return (
            f"sudo -n -- {command}"
            if self.password is None
            else f"sudo -S -v, then sudo -n -- {command}"
        )

    def start(self, chan: Channel) -> None:
        """What goes on stdin before anything is read: the prompt sudo -v is to print."""
        if self.nonce is not None:
            chan.sendall((self.nonce + "\n").encode())


def agent_words(words: list[str]) -> list[str]:
    """The bootstrap's argv words under become: --ready first."""
    return [READY, *words]


def frame(data: bytes) -> bytes:
    """The zip as the bootstrap's receive() reads it, on the agent's stdin, after it asked
    (send_agent)."""
    return AGENT_FRAME + b"%d\n" % len(data) + data


def handshake(chan: Channel, host: Host, sudo: Sudo, shown: str, timeout: float) -> bytes:
    """Wait for the bootstrap's ready line, answering sudo -v's prompt (this channel's nonce) with
    the password once, and only before VALIDATED. Returns the stdout that followed the ready line
    (the agent's, kept for its session). Raises TransportError naming sudo's refusal (no sudoers
    entry, a password needed, a wrong one, a prompt after sudo -v was done)."""
    started = time.monotonic()
    deadline = started + timeout
    out, err = bytearray(), bytearray()
    sent = False
    sudo.start(chan)
    while True:
        _receive(chan, out, err)
        said = _said(err, sudo)
        trouble = _prompt_trouble(host, said)
        if trouble is not None:
            chan.close()
            raise TransportError("auth", trouble, _evidence(shown, None, err, started, sudo))
        if said.prompts == 1 and not sent and sudo.password is not None and not said.validated:
            chan.sendall((sudo.password + "\n").encode())
            sent = True
        newline = out.find(b"\n")
        if newline >= 0:
            if _is_ready(bytes(out[:newline]), sudo, said):
                return bytes(out[newline + 1 :])
            chan.close()
            raise TransportError(
                "remote",
                f"{host.name}: the agent started through sudo did not say it was ready "
                "(its first line was something else); nothing was sent to it",
                _evidence(shown, None, err, started, sudo),
            )
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            code = chan.recv_exit_status()
            chan.close()
            raise refused(host, code, err, shown, started, sudo)
        remaining = deadline - time.monotonic()
        stuck = _stuck(host, len(out) + len(err), remaining, timeout)
        if stuck is not None:
            chan.close()
            kind, msg = stuck
            raise TransportError(kind, msg, _evidence(shown, None, err, started, sudo))
        select.select([chan], [], [], min(remaining, 0.5))


def _receive(chan: Channel, out: bytearray, err: bytearray) -> None:
    """What the channel holds now, on stdout and on stderr."""
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)


def _prompt_trouble(host: Host, said: _Said) -> str | None:
    """Why the handshake stops at a password prompt: one after sudo accepted the password, or a
    second one (the password was wrong). None when the prompts are as they should be."""
    if said.asked_after:
        return (
            f"{host.name}: the password prompt came again after sudo had accepted the "
            "password: something other than sudo asked for it; it was not sent "
            f"again, and nothing more runs on {host.name} (check what {host.python} "
            "is)"
        )
    if said.prompts > 1:
        return (
            f"{host.name}: sudo did not accept the become password for "
            f"{host.user or 'the login user'}; check it and run again (it was sent "
            "once; nothing ran as root)"
        )
    return None


def _is_ready(first_line: bytes, sudo: Sudo, said: _Said) -> bool:
    """The agent's ready line, after sudo validated the password when there was one."""
    return first_line.strip() == READY_LINE and (sudo.password is None or said.validated)


def _stuck(host: Host, received: int, remaining: float, timeout: float) -> tuple[str, str] | None:
    """The handshake given up on: too much said before the ready line, or no ready line in time."""
    if received > MAX_HANDSHAKE_BYTES:
        return (
            "remote",
            f"{host.name}: sudo and the agent sent more than "
            f"{MAX_HANDSHAKE_BYTES} bytes before the agent was ready; nothing was "
            "sent to it",
        )
    if remaining <= 0:
        return (
            "timeout",
            f"{host.name}: the agent did not start through sudo within "
            f"{timeout:.0f}s (sudo waiting for something?); nothing ran",
        )
    return None


class _Said:
    def __init__(self, prompts: int, validated: bool, asked_after: bool) -> None:
        self.prompts, self.validated, self.asked_after = prompts, validated, asked_after


def _said(err: bytes | bytearray, sudo: Sudo) -> _Said:
    """What stderr says so far: sudo -v's prompts before the marker, the marker, a prompt after
    it."""
    if sudo.nonce is None:
        return _Said(0, False, False)
    text = err.decode("utf-8", "replace")
    before, marker, after = text.partition(VALIDATED + "\n")
    return _Said(before.count(sudo.nonce), bool(marker), sudo.nonce in after)


def _said_by_sudo(text: str, code: int) -> str:
    """sudo's own line, else the last thing said, else the exit status."""
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and line.strip() != VALIDATED
    ]
    fallback = lines[-1] if lines else f"exit {code}"
    return next((line for line in lines if line.startswith("sudo")), fallback)


def _password_step(host: Host, text: str, sudo: Sudo | None, user: str) -> str:
    """sudo wanted a password to run the agent: why fleetops did not (or could not) give it."""
    if sudo is not None and sudo.spent:
        return (
            "sudo asked for the password again, to start the agent a second time in this run; "
            f"fleetops sends it once per host and run, never again: run again, or give {user} a "
            f"sudoers entry with NOPASSWD for {host.python}"
        )
    if VALIDATED in text:
        # sudo -v took the password, then sudo asked for it again for the command: fleetops sends it
        # once
        return (
            f"sudo accepted the password but asked for it again to run {host.python} (its "
            f"credential cache is off for {user}: timestamp_timeout=0?); the password is sent "
            f"once, never again: give {user} a sudoers entry with NOPASSWD for {host.python}"
        )
    return (
        f"give {user} a sudoers entry with NOPASSWD for {host.python}, or run again with "
        "--ask-become-pass to type sudo's password"
    )


def _next_step(host: Host, code: int, text: str, sudo: Sudo | None, user: str) -> str:
    if code == 127:
        return "install sudo on the node, or leave out become: for this host"
    if host.python in text and ("command not found" in text or "No such file" in text):
        return (
            f"the target python {host.python} was not "
            "found on the node: check this host's `python:`"
        )
    if "password is required" in text:
        return _password_step(host, text, sudo, user)
    return (
        f"give {user} a sudoers entry that lets it run "
        f"{host.python} as root (sudo -l -U {user} shows it)"
    )


def refused(
    host: Host,
    code: int,
    err: bytes | bytearray,
    shown: str,
    started: float,
    sudo: Sudo | None = None,
) -> TransportError:
    """sudo (or the node's shell) ended before the agent ran: its reason and the next step."""
    text = _text(err, sudo)
    user = host.user or "the login user"
    step = _next_step(host, code, text, sudo, user)
    return TransportError(
        "auth",
        f"{host.name}: sudo would not run the agent as root for {user} "
        f"({_said_by_sudo(text, code)}); {step}; nothing ran as root",
        _evidence(shown, code, err, started, sudo),
    )


def _text(err: bytes | bytearray, sudo: Sudo | None) -> str:
    """stderr as text, without this channel's prompt (noise to the reader)."""
    text = err.decode("utf-8", "replace")
    return text.replace(sudo.nonce, "") if sudo is not None and sudo.nonce else text


def _evidence(
    shown: str, code: int | None, err: bytes | bytearray, started: float, sudo: Sudo | None = None
) -> Evidence:
    lines = _text(err, sudo).splitlines()[-20:]
    return Evidence(
        shown, code, [line for line in lines if line.strip()], round(time.monotonic() - started, 3)
    )
