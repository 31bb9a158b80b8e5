"""The OpenSSH transport (wire.connector.Connector through the system `ssh`): one master connection
per host (ControlMaster, ControlPersist) in the control directory, the agent as one session through
it with the JSON protocol on its stdin and stdout (agentclient.AgentClient: the same bootstrap,
sha256 check, tickets and become handshake as the paramiko transport), files over the sftp subsystem
on the same master (sftpproto.py). Sessions on a live master of the control directory are opened by
this process on the master's control socket (muxclient.py: no `ssh` process each); where that
cannot be (a stale socket, a master that answers otherwise, a ControlPath outside the directory)
`ssh -T` and `ssh -s sftp` are started as ever. A master is written in its record (controldir.py)
when first used and touched on each later use; before this process starts a new one and MAX_MASTERS
are alive, the least recently used is closed (`ssh -O exit`).

Nothing here imports paramiko, cryptography or Fabric."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shlex
import stat
import subprocess
import threading
import time
from typing import IO, BinaryIO

from ..plans.host import UnknownHost, plain_host
from ..plans.inventory import Host, Inventory
from ..plans.jumphost import jump_of
from ..results import Evidence
from . import controldir, masters, muxclient, opensshkeys
from .agentclient import AgentClient
from .bundle import agent_bundle, launch_words
from .connector import (
    COUNTERS,
    ExecResult,
    TransportError,
    step_ended_unsaid,
    step_lost,
    step_overflow,
    step_timeout,
    upload_refused,
)
from .pythonpath import check_interpreter
from .session import AgentSession, Overflow, drain
from .sftp import (
    ReadPathSeen,
    check_read_path,
    copy_range,
    denied_hint,
    sftp_failed,
    write_atomically,
)
from .sftpproto import SFTPClient, over_pipes
from .sshcmd import (
    OFF_PERSIST,
    base_options,
    identity_digest,
    offered_certificates,
    persist_of,
    proxyjump_loop,
    resolved,
    resolved_all,
    with_options,
)
from .ssherrors import HOP_FAILED, SSH_FAILED, ssh_error
from .sshproc import PipeChannel, ProcessChannel, start

MAX_MASTERS_ENV = "FLEETOPS_MAX_MASTERS"
DEFAULT_MAX_MASTERS = 128  # ~3 MiB of RSS and a handful of descriptors each (docs/perf.md)
# this process's starts and closes of masters, one at a time per decision
_MASTERS_LOCK = threading.Lock()
# beyond the host's ConnectTimeout, how long a run waits for another run's login to its host (the
# key exchange, the authentication, a jump host's)
START_WAIT_S = 60.0
# how long a session started before the program's start-up may wait for the master to accept its
# socket and answer its hello: the master answers that itself, with no round trip to the node
EARLY_LOCAL_TIMEOUT = 1.0


class _NotOnMaster(Exception):
    """The early start found no master to open its session on: it starts nothing."""


def max_masters(host: Host) -> int:
    """How many masters may persist: FLEETOPS_MAX_MASTERS, else the inventory's `defaults:
    max_masters:`."""
    raw = os.environ.get(MAX_MASTERS_ENV, "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return host.max_masters or DEFAULT_MAX_MASTERS


def close_master(directory: str, socket: str) -> None:
    """Close the master behind this socket as `fleet disconnect` does (masters.close: `ssh -O exit`
    without the user's ssh_config, then waiting for it to exit; a stale socket removed), its record
    and identity forgotten."""
    masters.close(directory, socket)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, socket + IDENTITY_SUFFIX))


IDENTITY_SUFFIX = ".id"


def write_identity(directory: str, socket: str, digest: str) -> None:
    """Beside a master this process started: the identity_digest of the command line that made
    it."""
    controldir.write_private(directory, socket + IDENTITY_SUFFIX, digest.encode())


def read_identity(directory: str, socket: str) -> str | None:
    try:
        fd = os.open(os.path.join(directory, socket + IDENTITY_SUFFIX), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return os.read(fd, 128).decode("ascii", "replace")
    finally:
        os.close(fd)


def make_room(directory: str, keep: str, cap: int) -> None:
    """Before a new master: while the cap is reached, close the least recently used (never
    `keep`)."""
    live = [r for r in controldir.records(directory) if r.socket != keep]
    for record in live[: max(0, len(live) - cap + 1)]:
        close_master(directory, record.socket)


class OpenSSHConnection(AgentClient):
    """One node through the system `ssh`: a master connection, the agent's session and an SFTP
    session on it."""

    LINK_LOST_STATUS = SSH_FAILED

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        super().__init__(host, inventory)
        self.persist = persist_of(host)
        self._argv: list[str] | None = None
        self._settings: dict[str, str] = {}
        self._directory: str | None = None
        self._socket: str | None = None  # the master's socket name in the control directory
        self._opened = False
        self._starting: subprocess.Popen | None = None  # a master being started (close() stops it)
        self._aborted = False
        self._sftp_client: SFTPClient | None = None
        self._sftp_proc: subprocess.Popen | None = None
        self._sftp_chan: muxclient.MuxChannel | None = (
            None  # the SFTP session on the control socket
        )
        self._sftp_files: tuple[BinaryIO, ...] = ()
        self._sendenv: list[str] = []  # SendEnv's patterns, for sessions opened on the socket
        self._python_checked = False
        self._read_paths = ReadPathSeen()
        self._early_key: tuple | None = None  # what start_on_live_master started the agent for
        self._early = False  # start_on_live_master at work: a session's opening is not waited for

    @staticmethod
    def prepare() -> None:
        agent_bundle()
        launch_words()

    # -- the master
    def _command(self) -> list[str]:
        """The host's ssh command line, on the shared master's path (%C) until open() finds that
        master is another identity's."""
        if self._argv is None:
            if self.host.example:
                raise TransportError(
                    "refused",
                    f"{self.host.name} comes from an example inventory "
                    f"({self.host.source}); copy it to your own hosts/*.yaml to use it",
                )
            opensshkeys.named_keys(self.host)  # a missing key or unset passphrase, as on paramiko
            try:
                directory = controldir.control_dir()
            except controldir.ControlDirError as exc:
                raise TransportError("refused", f"{self.host.name}: {exc}") from None
            argv = base_options(self.host, self.inventory, controldir.control_path(directory))
            every = resolved_all(argv)
            self._settings = {key: values[0] for key, values in every.items()}
            self._sendenv = every.get("sendenv", [])
            if not self.host.jump or self.host.plain:
                loop = proxyjump_loop(self.host, argv, self._settings)
                if loop is not None:
                    raise loop
            path = self._settings.get("controlpath", "")
            if os.path.dirname(path) == directory:
                self._directory, self._socket = directory, os.path.basename(path)
            self._argv = argv
        return self._argv

    def _where(self) -> str:
        hostname = self._settings.get("hostname", self.host.address)
        return f"{hostname}:{self._settings.get('port', self.host.port)}"

    def _known_hosts(self) -> str:
        named = (
            self.host.known_hosts
            or (self._settings.get("userknownhostsfile", "").split() or [""])[0]
        )
        return os.path.expanduser(named or "~/.ssh/known_hosts")

    def _alive(self, argv: list[str]) -> bool:
        """Whether this command line's master is up: its socket is there (a master removes it when
        it ends; one killed outright leaves it, and ssh then logs in directly, without the
        master)."""
        if self._directory is None or self._socket is None:
            return False
        return stat.S_ISSOCK(_mode(os.path.join(self._directory, self._socket)))

    def open(self) -> None:
        """The host's master: the live one of this identity (its record touched), or a new one (`ssh
        -M -N -f`: ssh returns once the login is done and the master runs on in the background). A
        refusal is read from ssh's stderr. %C keys a master on host, port, user and jump, not on the
        key or the known_hosts file: a live master another identity made there (another key, another
        known_hosts) is never used; this identity then gets a master of its own, on a path keyed on
        all of it. One process at a time starts a socket's master (controldir.start_lock); a run
        that waited for another's start uses the master it made."""
        if self._opened:
            return
        argv = self._command()
        digest = identity_digest(argv)
        argv = self._reuse_live(argv, digest)
        if self._opened:
            return
        self._aborted = False
        if self._directory is None or self._socket is None:
            self._start(argv, digest)
            return
        wait = self.host.connect_timeout + START_WAIT_S
        try:
            lock = controldir.start_lock(self._directory, self._socket, lambda: self._aborted, wait)
            with lock as held:
                if not held:
                    raise self._not_started(wait)
                argv = self._reuse_live(argv, digest)  # another run's start, finished meanwhile
                if not self._opened:
                    self._start(argv, digest)
        except controldir.ControlDirError as exc:
            raise TransportError("refused", f"{self.host.name}: {exc}") from None

    def start_on_live_master(self) -> bool:
        """The agent started now, with no request, on this identity's live master (warmstart.py:
        before the program's own start-up); False, having started nothing, when no such master is
        up. Never logs in: a host without a live master is connected to by the run itself."""
        # become: its password handshake is the run's; persist 0: a master up now is another run's,
        # which this run's end would close (close() ends a persist-0 host's master)
        if self.host.become or self.persist == 0:
            return False
        argv = self._command()
        key = self._key(argv)
        self._reuse_live(argv, identity_digest(argv))
        if not self._opened:
            return False
        with self.lock:
            # the session's opening is confirmed while the program starts, read with its output
            self._early = True
            try:
                self._agent_session().started_early = True
            except _NotOnMaster:
                self.close()
                return False
            finally:
                self._early = False
        self._early_key = key
        return True

    def still_on_master(self) -> bool:
        """Whether the agent started early still runs in its session on the master, or ended on its
        own with its word to the run (a refusal) waiting to be read: a master that ended while the
        run was starting (another run's room made, `fleet disconnect`, a dropped link) took the
        session with it, and this connection would then reach the node without one."""
        session = self.session
        return (
            session is not None
            and isinstance(session.chan, muxclient.MuxChannel)
            and (session.alive() or self._refused_before_asked(session))
            and self._alive(self._argv or [])
        )

    def _refused_before_asked(self, session: AgentSession) -> bool:
        return (
            session.started_early
            and session.answered == 0
            and not session.queue
            and isinstance(session.chan, muxclient.MuxChannel)
            and session.chan.ended_by_node()
        )

    def same_connection(self, other: OpenSSHConnection) -> bool:
        """Whether `other`, made by the run, would reach the node as this one, started early, did:
        the same ssh command line, the same settings from `ssh -G`, the same agent command."""
        return self._early_key is not None and self._early_key == other._key(other._command())

    def _key(self, argv: list[str]) -> tuple:
        return (tuple(argv), tuple(sorted(self._settings.items())), tuple(self._agent_argv()[0]))

    def _not_started(self, waited: float) -> TransportError:
        if self._aborted:
            return TransportError(
                "interrupted",
                f"{self.host.name}: connecting was stopped (the run was interrupted) while "
                "another run was logging in to it; nothing ran there",
            )
        return TransportError(
            "timeout",
            f"{self.host.name}: another fleetops run has been starting its connection for "
            f"{waited:g}s; try again, or `fleet disconnect -H {self.host.name}`",
        )

    def _start(self, argv: list[str], digest: str) -> None:
        """A new master for this identity, the least recently used closed first when the cap is
        reached."""
        login = opensshkeys.login(self.host, self.inventory)
        with _MASTERS_LOCK:
            if self._directory is not None:
                make_room(self._directory, self._socket or "", max_masters(self.host))
        started = time.monotonic()
        code, text = self._start_master(argv, login)
        if self._aborted:
            raise TransportError(
                "interrupted",
                f"{self.host.name}: connecting was stopped (the run was "
                "interrupted) before the SSH login finished; nothing ran there",
            )
        if code != 0:
            raise self._login_error(argv, text, started)
        self._opened = True
        COUNTERS.bump(self.host.name, "connections")
        if self._directory is not None and self._socket is not None:
            write_identity(self._directory, self._socket, digest)
        self._record(fresh=True)

    def _reuse_live(self, argv: list[str], digest: str) -> list[str]:
        """A live master of this identity, used (then `_opened`); otherwise the command that starts
        this identity's own, on a socket keyed on all of it when another identity's master holds
        the shared one."""
        if not self._alive(argv):
            return argv
        if (
            self._directory is not None
            and self._socket is not None
            and read_identity(self._directory, self._socket) == digest
        ):
            self._opened = True
            self._record(fresh=False)
            return argv
        assert self._directory is not None
        self._socket = "i" + digest[:39]  # as long as %C: the directory's length check holds
        argv = self._argv = base_options(
            self.host, self.inventory, os.path.join(self._directory, self._socket)
        )
        if self._alive(argv):
            self._opened = True
            self._record(fresh=False)
        return argv

    def _start_master(self, argv: list[str], login: opensshkeys.Login) -> tuple[int, str]:
        """`ssh -M -N -f` (with what `login` adds for an encrypted key): its exit status once the
        login is done, and what it said on stderr."""
        persist = self.persist or OFF_PERSIST
        start = login.argv(
            with_options(
                argv, "-M", "-N", "-f", "-o", "ControlMaster=yes", "-o", f"ControlPersist={persist}"
            )
        )
        import tempfile  # only a master's start reads ssh's stderr from a file

        with tempfile.TemporaryFile() as err:
            try:
                self._starting = subprocess.Popen(
                    start,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    env=login.env,
                )
                code = self._starting.wait()
            finally:
                self._starting = None
            err.seek(0)
            return code, err.read(64 * 1024).decode("utf-8", "replace")

    def _login_error(self, argv: list[str], text: str, started: float) -> TransportError:
        """ssh's refusal of the login, the jump host named when it is the one at fault."""
        jump = self.host.jump or ""
        if not jump and self._settings.get("proxyjump") != "none":
            jump = self._settings.get("proxyjump", "")
        error = ssh_error(
            self.host,
            text,
            argv,
            self._where(),
            self._known_hosts(),
            "ssh (login)",
            jump,
            lambda: offered_certificates(argv),
        )
        if jump and HOP_FAILED in text:
            error = self._jump_error(jump, error)
        if error.evidence is not None:
            error.evidence.seconds = round(time.monotonic() - started, 3)
        return error

    def _jump_error(self, jump: str, error: TransportError) -> TransportError:
        """The jump host failed (ssh says only that its proxy closed): log in to the jump host
        alone, as the hop does, and name what it says (an unknown key, a refused login, nothing
        listening)."""
        if self.host.jump and not self.host.plain:
            try:
                hop_host = jump_of(self.host, self.inventory)
            except UnknownHost:
                return error
            argv = base_options(hop_host, self.inventory, None)
        else:
            hop_host = plain_host(jump.split(",")[0])
            argv = base_options(hop_host, None, None)
        settings = resolved(argv)
        where = (
            f"{settings.get('hostname', hop_host.address)}:{settings.get('port', hop_host.port)}"
        )
        named = hop_host.known_hosts or (settings.get("userknownhostsfile", "").split() or [""])[0]
        try:
            done = subprocess.run(
                [*argv, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=hop_host.connect_timeout + 5,
                check=False,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired):
            return error
        if done.returncode != SSH_FAILED:
            return error
        hop = ssh_error(
            hop_host,
            done.stderr.decode("utf-8", "replace"),
            argv,
            where,
            os.path.expanduser(named or "~/.ssh/known_hosts"),
            "ssh (jump host)",
            certificates=lambda: offered_certificates(argv),
        )
        return TransportError(hop.kind, f"{self.host.name}: its jump host {hop}", hop.evidence)

    def _record(self, fresh: bool) -> None:
        if self._directory is None or self._socket is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if not fresh and controldir.read_record(self._directory, self._socket) is not None:
                controldir.touch(self._directory, self._socket)
                return
            now = time.time()
            port = self._settings.get("port", str(self.host.port))
            controldir.write_record(
                self._directory,
                controldir.MasterRecord(
                    socket=self._socket,
                    host=self.host.name,
                    hostname=self._settings.get("hostname", self.host.address),
                    user=self._settings.get("user", self.host.user or ""),
                    port=int(port) if port.isdigit() else 22,
                    jump=self._settings.get("proxyjump", "")
                    if self._settings.get("proxyjump") != "none"
                    else (self.host.jump or ""),
                    opened=now,
                    used=now,
                ),
            )

    def close(self) -> None:
        """End the agent (its stdin closes), the SFTP session, and a master start in progress; with
        `persist: 0` the master too. Safe from another thread (Ctrl-C)."""
        starting = self._starting
        if starting is not None:
            self._aborted = True
            with contextlib.suppress(OSError):
                starting.kill()
        session, self.session = self.session, None
        self.held = []
        if session is not None:
            with contextlib.suppress(*self.LINK_ERRORS):
                session.chan.shutdown_write()
            self._end_session(session)
        self._close_sftp()
        if self._opened:
            self._opened = False
            COUNTERS.event(self.host.name, "closed")
            if self.persist == 0 and self._directory is not None and self._socket is not None:
                close_master(self._directory, self._socket)

    # -- commands
    def _remote(self, argv: list[str]) -> PipeChannel:
        self.open()
        assert self._argv is not None
        command = shlex.join(argv)
        chan = self._on_socket(command)
        if chan is not None:
            return chan
        if self._early:  # `ssh` would log in on its own: the early start is for live masters only
            raise _NotOnMaster
        return ProcessChannel([*with_options(self._argv, "-o", "LogLevel=ERROR"), command])

    def _on_socket(
        self, command: str, subsystem: bool = False, stderr: bool = True
    ) -> muxclient.MuxChannel | None:
        """A session opened on this identity's master's control socket, as `ssh` would open it
        there (SendEnv's variables passed); None when it cannot be: `ssh` is started instead."""
        if self._directory is None or self._socket is None:
            return None
        env = tuple(
            f"{name}={value}"
            for name, value in os.environ.items()
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self._sendenv)
        )
        try:
            return muxclient.open_session(
                self._directory,
                self._socket,
                command,
                subsystem,
                env,
                stderr,
                wait=not self._early,
                local_timeout=EARLY_LOCAL_TIMEOUT if self._early else muxclient.OPEN_TIMEOUT,
            )
        except muxclient.MuxUnavailable:
            return None

    def _open_channel(self, argv: list[str], shown: str) -> PipeChannel:
        if self.host.become:
            self._check_python_before_sudo(shown)
        COUNTERS.bump(self.host.name, "execs")
        try:
            return self._remote(argv)
        except OSError as exc:
            raise TransportError(
                "lost",
                f"connection to {self.host.name} lost while starting the agent "
                f"({exc.strerror or exc})",
                Evidence(shown, None, [], 0.0),
            ) from None

    def exec(
        self, argv: list[str], stdin: bytes = b"", timeout: float = 300, shown: str | None = None
    ) -> ExecResult:
        """Run argv on the node (quoted word by word), collect stdout, stderr and the exit
        status."""
        command = shlex.join(argv)
        started = time.monotonic()
        COUNTERS.bump(self.host.name, "execs")
        chan = self._remote(argv)
        command = shown or command
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = drain(chan, started + timeout)
        except Overflow as exc:
            chan.close()
            raise step_overflow(self.host.name, exc, command, started) from None
        except TimeoutError:
            chan.close()
            raise step_timeout(self.host.name, timeout, command, started) from None
        except (OSError, EOFError) as exc:
            chan.close()
            raise step_lost(self.host.name, exc, command, started) from None
        result = ExecResult(command, code, out, err, time.monotonic() - started)
        if code is None or (code == SSH_FAILED and not self._alive(self._command())):
            self.close()
            raise step_ended_unsaid(self.host.name, result)
        return result

    # -- files
    def _sftp_alive(self) -> bool:
        if self._sftp_chan is not None:
            return not self._sftp_chan.exit_status_ready()
        return self._sftp_proc is not None and self._sftp_proc.poll() is None

    def _sftp(self) -> SFTPClient:
        """The SFTP session on the host's master (on its control socket, else `ssh -s ...
        sftp`), started on first use."""
        if self._sftp_client is not None and self._sftp_alive():
            return self._sftp_client
        self._close_sftp()
        self.open()
        assert self._argv is not None
        chan = self._on_socket("sftp", subsystem=True, stderr=False)
        if chan is not None:
            self._sftp_chan = chan
            self._sftp_files = chan.files()
            try:
                self._sftp_client = over_pipes(*self._sftp_files)
            except (OSError, EOFError) as exc:
                self._close_sftp()
                raise TransportError("remote", sftp_failed(self.host, exc)) from None
            return self._sftp_client
        argv = with_options(self._argv, "-o", "LogLevel=ERROR", "-s")
        try:
            proc = start(
                [*argv, "sftp"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise TransportError("remote", sftp_failed(self.host, exc)) from None
        assert proc.stdin is not None and proc.stdout is not None
        self._sftp_proc = proc
        try:
            self._sftp_client = over_pipes(proc.stdin, proc.stdout)
        except (OSError, EOFError) as exc:
            self._close_sftp()
            raise TransportError("remote", sftp_failed(self.host, exc)) from None
        return self._sftp_client

    def _close_sftp(self) -> None:
        chan, self._sftp_chan = self._sftp_chan, None
        files, self._sftp_files = self._sftp_files, ()
        for file in files:
            _close_stream(file)  # before the descriptors under them are closed
        if chan is not None:
            chan.close()
        proc, self._sftp_proc, self._sftp_client = self._sftp_proc, None, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            _close_stream(stream)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def upload(self, path: str, data: bytes) -> None:
        """Write path atomically over SFTP (temp name, then rename), making its missing
        folders 0700."""
        try:
            write_atomically(self._sftp(), path, data)
        except (OSError, EOFError) as exc:
            raise upload_refused(self.host, path, exc) from None

    def download(self, path: str) -> bytes:
        try:
            with self._sftp().open(path, "rb") as f:
                return f.read()
        except EOFError as exc:
            raise TransportError(
                "lost", f"{self.host.name}: download of {path} stopped ({exc})"
            ) from None

    def download_to(
        self, remote: str, local_path: str, offset: int, end: int, progress: object = None
    ) -> int:
        """Bytes [offset, end) of remote, over SFTP, into local_path at offset (a partial copy
        resumes)."""
        if self.host.become:
            check_read_path(self._sftp(), self.host, remote, self._read_paths)
        return copy_range(
            self._sftp,
            remote,
            local_path,
            offset,
            end,
            progress,
            self.host.name,
            self._sftp_alive,
            denied_hint(self.host),
        )

    def _check_python_before_sudo(self, shown: str) -> None:
        """become: `python:` checked as the login user over SFTP before sudo runs it
        (wire/pythonpath.py)."""
        if self._python_checked:
            return
        check_interpreter(self._sftp, self.host, shown)
        self._python_checked = True


def _mode(path: str) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _close_stream(stream: IO[bytes] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()
