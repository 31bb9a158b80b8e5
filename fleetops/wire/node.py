"""NodeConnection: one node, one SSH connection per run, many agent calls (wire.connector.Connector)."""

from __future__ import annotations

import errno
import json
import shlex
import socket
import stat
import threading
import time

import paramiko
from fabric import Connection

from ..agent.core.protocol import PROTOCOL
from ..identity import operator
from ..plans.inventory import Host, Inventory
from ..plans.pathtrust import Entry, judge_read
from ..results import Evidence
from . import become
from .bundle import ALLOW_INSECURE_VENV, EXIT_BOOTSTRAP_REFUSED, PYTHON_FLAGS, agent_bundle, launch_words
from .connector import COUNTERS, ExecResult, TransportError
from .errors import connect_error
from .hops import close_quietly, fabric_connection, slow_idle_checks
from .pythonpath import check_interpreter
from .session import AgentSession, Overflow, Ticket, drain, session_refused
from .sftp import copy_range, sftp_failed, write_atomically

# What one answer line may hold: json.loads makes ~20 million small values a second and every parser of an
# answer walks them, so a 32 MiB line of `0,0,0,...` would cost the client seconds of CPU. Real answers stay
# below: fetch's 50,000-file manifest (~10 values a file), `run`'s 2 MiB kept of each stream unless both are
# little but commas (commas in strings count: the bound is a count of bytes, made before any parsing).
MAX_ANSWER_VALUES = 4_000_000


class NodeConnection:
    """One node, one SSH connection, many agent calls."""

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        self.host = host
        self.inventory = inventory
        self.cxn: Connection | None = None
        self.session: AgentSession | None = None  # the agent of this run on this host
        self.requests = 0
        self.held: list[Ticket] = []  # submitted, to go out right behind the next request sent
        self.lock = threading.Lock()
        # The connection being opened, and its sockets, so that close() from another thread (Ctrl-C) ends a
        # connect or a handshake in progress at once instead of after connect_timeout.
        self._opening: Connection | None = None
        self._sockets: list[socket.socket] = []
        self._aborted = False
        self._python_checked: Connection | None = None  # become: the connection `python:` was checked on
        self._password_sent = False  # become: this run's one channel that may get the password has started
        self._login_uid: int | None = None  # become: the login user's uid, from its SFTP start directory
        self._lstats: dict[str, Entry] = {}  # become: the directories of fetched paths, as lstat found them

    # -- connecting
    def open(self) -> None:
        if self.cxn is not None and self.cxn.is_connected:
            return
        host = self.host
        cxn = fabric_connection(host, self.inventory)
        self._aborted = False
        self._opening = cxn
        try:
            if not cxn.gateway and "sock" not in cxn.connect_kwargs:
                cxn.connect_kwargs["sock"] = self._tcp_connect(cxn)
            cxn.open()
        except Exception as exc:  # connect_error names host, cause, next step for every failure
            error = (TransportError("interrupted", f"{host.name}: connecting was stopped (the run was interrupted) "
                                                   "before the SSH login finished; nothing ran there")
                     if self._aborted else connect_error(exc, host, cxn))
            close_quietly(cxn)
            raise error from None
        finally:
            self._opening = None
            self._sockets = []
        self.cxn = cxn
        slow_idle_checks(cxn)
        COUNTERS.bump(host.name, "connections")

    def _tcp_connect(self, cxn: Connection) -> socket.socket:
        """The TCP connection paramiko's SSHClient.connect would make (every address of the name in turn, the
        same errors), on sockets close() can reach while it waits."""
        timeout = cxn.connect_timeout
        infos = socket.getaddrinfo(cxn.host, cxn.port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        to_try = [(i[0], i[4]) for i in infos if i[1] == socket.SOCK_STREAM] or [(i[0], i[4]) for i in infos]
        errors: dict = {}
        for family, addr in to_try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            self._sockets.append(sock)
            if self._aborted:
                raise ConnectionAbortedError(errno.ECONNABORTED, "interrupted")
            try:
                sock.settimeout(timeout)
                sock.connect(addr)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    raise
                errors[addr] = exc
        raise paramiko.ssh_exception.NoValidConnectionsError(errors)

    @staticmethod
    def prepare() -> None:
        """Build (or read from its cache) the agent bundle and the bootstrap's launch words every connection's
        first request needs."""
        agent_bundle()
        launch_words()

    def close(self) -> None:
        """End the agent (its stdin closes: it exits) and the connection, or stop a connect in progress. Safe from
        another thread (Ctrl-C)."""
        opening = self._opening
        if opening is not None:
            self._aborted = True
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # a connect() waiting for its SYN-ACK ends at once
                except OSError:
                    pass
            close_quietly(opening)  # a handshake waiting for the banner, on this hop or a jump host's
        session, self.session = self.session, None
        self.held = []  # never sent: nothing to undo
        if session is not None:
            try:
                session.chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
            self._end_session(session)
        if self.cxn is not None:
            close_quietly(self.cxn)
            self.cxn = None
            COUNTERS.event(self.host.name, "closed")

    # -- raw exec
    def exec(self, argv: list[str], stdin: bytes = b"", timeout: float = 300, shown: str | None = None) -> ExecResult:
        """Run argv (quoted word by word: no value ever becomes shell syntax) with stdin, collect all. `shown`:
        how the evidence names the command (the agent's bootstrap is long; its text is bundle.BOOTSTRAP)."""
        self.open()
        assert self.cxn is not None
        command = shlex.join(argv)
        started = time.monotonic()
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(command)
            command = shown or command
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, code = drain(chan, started + timeout)
        except paramiko.ChannelException as exc:
            self.close()
            raise session_refused(self.host, exc, shown or command) from None
        except Overflow as exc:
            raise TransportError("remote", f"{self.host.name}: {exc}; stopped reading it, the node's outcome is "
                                           "unknown", Evidence(command, None, [], round(time.monotonic() - started,
                                                                                       3))) from None
        except TimeoutError:
            raise TransportError("timeout", f"{self.host.name}: no answer within {timeout:.0f}s",
                                 Evidence(command, None, [], round(time.monotonic() - started, 3))) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost during the step ({exc or 'EOF'}); "
                                         "the node's outcome is unknown",
                                 Evidence(command, None, [], round(time.monotonic() - started, 3))) from None
        result = ExecResult(command, code, out, err, time.monotonic() - started)
        if code is None:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                         "outcome is unknown", result.evidence())
        return result

    # -- the agent
    def _agent_argv(self) -> tuple[list[str], str, become.Sudo | None]:
        """The agent's command, how evidence shows it, and (become) how it goes through sudo: the constant
        bootstrap (bundle.BOOTSTRAP) checks the state dir like StrictModes and runs the zip only if its bytes
        have the sha256 this client expects."""
        bundle = agent_bundle()
        path = f"{self.host.state_dir}/bin/{bundle.filename}"
        allow = [ALLOW_INSECURE_VENV] if self.inventory is not None and self.inventory.allow_insecure_venv else []
        words = [self.host.state_dir, path, bundle.sha256, *allow]
        return self._bootstrap_argv(become.agent_words(words) if self.host.become else words)

    def _bootstrap_argv(self, words: list[str]) -> tuple[list[str], str, become.Sudo | None]:
        command = [self.host.python, *PYTHON_FLAGS, *launch_words(), *words]
        shown = shlex.join([self.host.python, *PYTHON_FLAGS, "-c", "<fleetops bootstrap>", *words])
        if not self.host.become:
            return command, shown, None
        password = self._become_password()
        sudo = become.Sudo(password, spent=self._password_sent)  # a fresh prompt for every channel
        self._password_sent = self._password_sent or password is not None
        return sudo.argv(command), sudo.shown(shown), sudo

    def _become_password(self) -> str | None:
        return self.inventory.become_password if self.inventory is not None else None

    def upload_agent(self) -> None:
        """Without become: the zip over SFTP, as the login user, into its own state dir (under become the
        bootstrap run by root receives it on its stdin instead: _send_agent)."""
        bundle = agent_bundle()
        self.upload(f"{self.host.state_dir}/bin/{bundle.filename}", bundle.data)
        COUNTERS.bump(self.host.name, "uploads")

    def _send_agent(self, session: AgentSession) -> None:
        """become: the bootstrap run by root asked for the agent on this channel (send_agent): the zip, then every
        request in flight again. It writes the zip into root's state dir only if its bytes have the sha256 it was
        started with (nothing the login user wrote is ever run by root), then runs it: one sudo per host."""
        session.retried = True
        try:
            session.chan.sendall(become.frame(agent_bundle().data))
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the read that follows finds out why
        COUNTERS.bump(self.host.name, "uploads")
        tickets = list(session.queue)
        session.queue.clear()
        for ticket in tickets:
            self._write(session, ticket, again=True)

    def upload(self, path: str, data: bytes) -> None:
        """Write path atomically over SFTP (temp name, then rename), making its missing folders 0700."""
        self.open()
        try:
            assert self.cxn is not None
            write_atomically(self._sftp(), path, data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
            raise TransportError("remote", f"{self.host.name}: cannot write {path} on the node over SFTP ({reason}); "
                                           f"check that the login user may write {self.host.state_dir} and the "
                                           "node's free disk space") from None

    def _sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session; a subsystem that does not start is named as such."""
        assert self.cxn is not None
        try:
            return self.cxn.sftp()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportError("remote", sftp_failed(self.host, exc)) from None

    def download(self, path: str) -> bytes:
        self.open()
        assert self.cxn is not None
        with self._sftp().open(path, "rb") as f:
            return f.read()

    def download_to(self, remote: str, local_path: str, offset: int, end: int, progress: object = None) -> int:
        """Bytes [offset, end) of remote, over SFTP, into local_path at offset (truncated there first, so a
        partial copy resumes). progress(n) is called with the bytes written so far. Returns them."""
        self.open()
        assert self.cxn is not None
        user = self.host.user or "the login user"
        denied = (f" (under become: sudo the job's files are root's, and fleetops never reads files as root over "
                  f"SFTP; make them readable by {user}, e.g. chmod a+r on the node, then fetch again)"
                  if self.host.become else "")
        if self.host.become:
            self._check_read_path(remote)
        return copy_range(self._sftp, remote, local_path, offset, end, progress, self.host.name,
                          lambda: self.cxn is not None and self.cxn.is_connected, denied)

    def _check_read_path(self, remote: str) -> None:
        """become: the agent (root) listed the file by descriptor; the login user's SFTP read goes by path, so
        it reads only through directories no one but root and the login user can change (pathtrust.judge_read),
        else it is refused plainly, nothing read."""
        sftp = self._sftp()
        user = self.host.user or "the login user"
        try:
            if self._login_uid is None:
                home = sftp.lstat(sftp.normalize("."))
                if home.st_uid is None:
                    raise OSError("the SFTP start directory says no owner")
                self._login_uid = int(home.st_uid)
            problem = judge_read(remote, lambda path: self._lstat(sftp, path),
                                 lambda path: sftp.readlink(path) or "", frozenset({0, self._login_uid}))
        except PermissionError:
            return  # what the login user may not lstat it may not open either: the read says so plainly
        except (OSError, EOFError, paramiko.SSHException) as exc:
            reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
            raise TransportError("remote", f"{self.host.name}: cannot check the path of {remote} as {user} before "
                                           f"reading it ({reason}); nothing read") from None
        if problem is not None:
            raise TransportError("remote", f"{self.host.name}: refusing to read {remote} as {user}: "
                                           f"{problem.describe()}; nothing read")

    def _lstat(self, sftp: paramiko.SFTPClient, path: str) -> Entry | None:
        """SFTP lstat, directories kept for the run (a directory of many files is asked once)."""
        known = self._lstats.get(path)
        if known is not None:
            return known
        try:
            attrs = sftp.lstat(path)
        except FileNotFoundError:
            return None
        entry = Entry(int(attrs.st_mode or 0), int(attrs.st_uid if attrs.st_uid is not None else -1),
                      int(attrs.st_gid if attrs.st_gid is not None else -1))
        if stat.S_ISDIR(entry.mode):
            self._lstats[path] = entry
        return entry

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """One request to this host's agent: the first call of the run starts it (one exec, through the
        verifying bootstrap), every later one is a line on the same channel. Requests held by
        submit() go out right behind it, before its answer is in."""
        with self.lock:
            ticket = Ticket(self, op, request, timeout)
            self._send([ticket, *self._take_held()])
            return self._answer_of(ticket)

    def ask(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """call(), with the requests submit() holds left held: they go out behind the step's own request, which
        needs this answer first (patch asks for the installed versions before it may write)."""
        with self.lock:
            ticket = Ticket(self, op, request, timeout)
            self._send([ticket])
            return self._answer_of(ticket)

    def submit(self, op: str, request: dict, timeout: float = 300) -> Ticket:
        """call(), pipelined (Connector.submit; read-only ops only): sent now, behind the requests in flight,
        or held and sent right behind the next request that goes out. Its answer is read in turn (the agent
        answers in request order) by result()."""
        with self.lock:
            ticket = Ticket(self, op, request, timeout, ahead=True)
            session = self.session
            if session is not None and session.queue and not self.held and session.alive():
                self._send([ticket])
            else:
                self.held.append(ticket)
            return ticket

    def _take_held(self) -> list[Ticket]:
        held, self.held = self.held, []
        return held

    def _collect(self, ticket: Ticket) -> tuple[dict, Evidence]:
        with self.lock:
            if ticket in self.held:  # nothing went out before it (the step it followed made no call): now
                self.held.remove(ticket)
                ticket.ahead = False
                self._send([ticket, *self._take_held()])
            elif ticket.stale:
                # A request of the step before it went out after it, so its answer may predate that request's
                # effect: ask again, in turn (the early answer is read and dropped on the way).
                ticket.dropped = True
                ticket = Ticket(self, ticket.op, ticket.request, ticket.timeout)
                self._send([ticket, *self._take_held()])
            return self._answer_of(ticket)

    def _discard(self, ticket: Ticket) -> None:
        with self.lock:
            if ticket in self.held:
                self.held.remove(ticket)
            ticket.dropped = True

    def _send(self, tickets: list[Ticket]) -> None:
        """Write the request lines on the live agent session (started if there is none: one exec), in order."""
        session = self._agent_session()
        for ticket in tickets:
            self._write(session, ticket)

    def _write(self, session: AgentSession, ticket: Ticket, again: bool = False) -> None:
        if ticket.id is None:
            self.requests += 1
            ticket.id = self.requests
        if not ticket.ahead:  # a request of the step itself, after ones sent ahead: theirs may predate it
            for earlier in session.queue:
                earlier.stale = earlier.stale or earlier.ahead
        ahead = ticket.ahead and bool(session.queue)
        payload = (json.dumps({"protocol": PROTOCOL, "op": ticket.op, "state_dir": self.host.state_dir,
                               "operator": operator(), **ticket.request, "_id": ticket.id}) + "\n").encode()
        ticket.session, ticket.sent = session, time.monotonic()
        session.queue.append(ticket)
        try:
            session.chan.sendall(payload)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the read that follows finds out why (a refusal line, the agent's end, a lost link)
        if not again:
            COUNTERS.event(self.host.name, "sent_ahead" if ahead else "sent", ticket.op)

    def _answer_of(self, ticket: Ticket) -> tuple[dict, Evidence]:
        """Read answers in request order (keeping earlier tickets' answers on them) up to this ticket's."""
        deadline = time.monotonic() + ticket.timeout
        while not ticket.done:
            session = ticket.session
            if session is None or session is not self.session or not session.queue:
                raise TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                             "outcome is unknown", Evidence(session.shown if session else "(agent)",
                                                                            None, [], 0.0))
            self._read_next(session, ticket, deadline)
        if ticket.error is not None:
            raise ticket.error
        assert ticket.answer is not None and ticket.evidence is not None
        return ticket.answer, ticket.evidence

    def _read_next(self, session: AgentSession, waiting: Ticket, deadline: float) -> None:
        """The answer of the oldest request in flight, onto its ticket; when the session ends instead, every
        request in flight gets the error (the one waited for raises it; the others were sent ahead)."""
        head = session.queue[0]
        try:
            line = session.read_line(deadline)
        except Overflow as exc:
            evidence = session.evidence(None, head.sent)
            self._end_session(session)  # its channel closes: the node's agent goes with it
            self._fail(session, TransportError("remote", f"{self.host.name}: {exc}; its session is dropped and the "
                                                         "node's outcome is unknown (a fleetops agent never sends "
                                                         f"that much: check what {self.host.python} runs on the "
                                                         "node)", evidence))
            return
        except TimeoutError:
            self._end_session(session)  # the agent's watchdog sees its client go and stops where it is
            self._fail(session, TransportError("timeout", f"{self.host.name}: no answer within {waiting.timeout:.0f}s",
                                               session.evidence(None, head.sent)))
            return
        except (OSError, EOFError, paramiko.SSHException) as exc:
            evidence = session.evidence(None, head.sent)
            self.close()
            self._fail(session, TransportError("lost", f"connection to {self.host.name} lost during the step "
                                                       f"({exc or 'EOF'}); the node's outcome is unknown", evidence))
            return
        if line is None:  # the agent ended instead of answering (refused, no interpreter, crashed)
            self._end_session(session)
            code = session.code
            evidence = session.evidence(code, head.sent)
            if code is None:
                self.close()
                error = TransportError("lost", f"connection to {self.host.name} lost during the step; the node's "
                                               "outcome is unknown", evidence)
            elif code == 127:
                error = TransportError("remote", f"{self.host.name}: the target python {self.host.python} was not "
                                                 "found on the node", evidence)
            else:
                error = TransportError("remote", f"{self.host.name}: the node agent failed (exit {code}) before it "
                                                 "answered", evidence)
            self._fail(session, error)
            return
        fresh = session.answered == 0
        session.answered += 1
        answer, why = self._decode(line)
        if answer is None:
            self._end_session(session)
            self._fail(session, TransportError("remote", f"{self.host.name}: {why}; its session is dropped and the "
                                                         "node's outcome is unknown",
                                               session.evidence(None, head.sent)))
            return
        if answer.get("bootstrap") is True:  # nothing of ours ran; a next call starts afresh
            evidence = session.evidence(EXIT_BOOTSTRAP_REFUSED, head.sent)
            if fresh and answer.get("error_kind") == "agent_missing" and answer.get("send_agent") is True \
                    and self.host.become and not session.retried:
                self._send_agent(session)
                return
            self._end_session(session)
            if fresh and answer.get("error_kind") == "agent_missing" and not session.retried and not self.host.become:
                self.upload_agent()  # first visit of this agent version; then every request in flight again
                again = self._agent_session()
                again.retried = True
                for ticket in list(session.queue):
                    self._write(again, ticket, again=True)
                session.queue.clear()
                return
            self._fail(session, TransportError("untrusted", f"{self.host.name}: {answer.get('error')}", evidence))
            return
        evidence = session.evidence(0, head.sent)
        session.answered_one()
        if answer.get("_id") != head.id:
            self.close()
            self._fail(session, TransportError("remote", f"{self.host.name}: the node agent answered out of turn "
                                                         f"(request {head.id}, answer {answer.get('_id')}); "
                                                         "connection reset", evidence))
            return
        session.queue.popleft()
        head.done, head.evidence = True, evidence
        if answer.get("agent_error"):
            head.error = TransportError("remote", f"{self.host.name}: the node agent failed on {head.op}: "
                                                  f"{answer.get('error')} (its traceback is in the node's stderr "
                                                  "below; the agent goes on)", evidence)
        else:
            head.answer = answer
        COUNTERS.event(self.host.name, "answered", head.op)

    def _decode(self, line: bytes) -> tuple[dict | None, str]:
        """One answer line as a dict, or None and why not. Its values are counted before json.loads makes them
        (a bound on the work of every parser after it)."""
        values = line.count(b",")  # commas in strings count too: a bound, not the number
        if values > MAX_ANSWER_VALUES:
            return None, (f"the node agent's answer holds more than {MAX_ANSWER_VALUES:,} values ({values:,} commas "
                          f"in {len(line):,} bytes), refused unread (a fleetops agent never sends that many: check "
                          f"what {self.host.python} runs on the node)")
        try:
            answer = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deeper than Python can
            answer = None
        if not isinstance(answer, dict):
            return None, "the node agent gave no JSON answer (or one nested too deeply to read)"
        return answer, ""

    @staticmethod
    def _fail(session: AgentSession, error: TransportError) -> None:
        for ticket in session.queue:
            ticket.done, ticket.error = True, error
        session.queue.clear()

    def _agent_session(self) -> AgentSession:
        """The live agent of this connection, started if there is none (or the last one ended)."""
        session = self.session
        if session is not None and session.alive():
            return session
        if session is not None:
            self._end_session(session)
        self.open()
        assert self.cxn is not None
        argv, shown, sudo = self._agent_argv()
        chan = self._open_channel(argv, shown)
        ahead = b""
        if sudo is not None:
            try:
                ahead = become.handshake(chan, self.host, sudo, shown,
                                         self.host.connect_timeout + 50)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self.close()
                raise TransportError("lost", f"connection to {self.host.name} lost while starting the agent "
                                             f"({exc or 'EOF'})", Evidence(shown, None, [], 0.0)) from None
        self.session = AgentSession(chan, shown)
        self.session.out += ahead
        return self.session

    def _open_channel(self, argv: list[str], shown: str) -> paramiko.Channel:
        self.open()
        assert self.cxn is not None
        if self.host.become:
            self._check_python_before_sudo(shown)
        COUNTERS.bump(self.host.name, "execs")
        try:
            chan = self.cxn.transport.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(shlex.join(argv))
        except paramiko.ChannelException as exc:
            self.close()
            raise session_refused(self.host, exc, shown) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise TransportError("lost", f"connection to {self.host.name} lost while starting the agent "
                                         f"({exc or 'EOF'})", Evidence(shown, None, [], 0.0)) from None
        return chan

    def _check_python_before_sudo(self, shown: str) -> None:
        """become: sudo would run `python:` as root before any check on the node could; the login user checks
        the path first, over SFTP (wire/pythonpath.py)."""
        cxn = self.cxn
        assert cxn is not None
        if self._python_checked is cxn:  # once per connection: only root and the login user could change it since
            return
        check_interpreter(cxn.sftp, self.host, shown)
        self._python_checked = cxn

    def _end_session(self, session: AgentSession) -> None:
        if self.session is session:
            self.session = None
        try:
            session.chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass
