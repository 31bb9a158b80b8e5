"""The agent's side of a connector, whatever carries it: the bootstrap's command (become included),
requests as tickets answered in order on one session, pipelining (submit), the first visit's upload
and the errors of a session that ends. A transport subclasses AgentClient and gives it open / close
/ _open_channel / upload; the session's channel is anything shaped like session.Channel (a paramiko
channel, an `ssh` process's pipes)."""

from __future__ import annotations

import json
import shlex
import threading
import time

from ..agent.core.protocol import PROTOCOL
from ..identity import operator
from ..plans.inventory import Host, Inventory
from ..results import Evidence
from . import become
from .bundle import (
    ALLOW_INSECURE_VENV,
    EXIT_BOOTSTRAP_REFUSED,
    PYTHON_FLAGS,
    agent_bundle,
    launch_words,
)
from .connector import COUNTERS, TransportError
from .session import AgentSession, Channel, Overflow, Ticket

# What one answer line may hold: json.loads makes ~20 million small values a second and every parser
# of an answer walks them, so a 32 MiB line of `0,0,0,...` would cost the client seconds of CPU.
# Real answers stay below: fetch's 50,000-file manifest (~10 values a file), `run`'s 2 MiB kept of
# each stream unless both are little but commas (commas in strings count: the bound is a count of
# bytes, made before any parsing).
MAX_ANSWER_VALUES = 4_000_000


class AgentClient:
    """One node's agent, over whatever link the subclass opens."""

    # What a broken link raises while writing or reading (a transport adds its own library's
    # errors).
    LINK_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError)
    # The exit status that means the link, not the agent, ended the session (the system ssh's 255);
    # None: the transport sees a lost link as no exit status at all.
    LINK_LOST_STATUS: int | None = None

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        self.host = host
        self.inventory = inventory
        self.session: AgentSession | None = None  # the agent of this run on this host
        self.requests = 0
        self.held: list[Ticket] = []  # submitted, to go out right behind the next request sent
        self.lock = threading.Lock()
        # become: this run's one channel that may get the password has started
        self._password_sent = False

    # -- what a transport gives
    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def upload(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def _open_channel(self, argv: list[str], shown: str) -> Channel:
        """The agent's command started on the node (argv shlex-quoted word by word), its channel."""
        raise NotImplementedError

    def _agent_argv(self) -> tuple[list[str], str, become.Sudo | None]:
        """The agent's command, how evidence shows it, and (become) how it goes through sudo: the
        constant bootstrap (bundle.BOOTSTRAP) checks the state dir like StrictModes and runs the zip
        only if its bytes have the sha256 this client expects."""
        bundle = agent_bundle()
        path = f"{self.host.state_dir}/bin/{bundle.filename}"
        allow = (
            [ALLOW_INSECURE_VENV]
            if self.inventory is not None and self.inventory.allow_insecure_venv
            else []
        )
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
        """Without become: the zip over SFTP, as the login user, into its own state dir (under
        become the bootstrap run by root receives it on its stdin instead: _send_agent)."""
        bundle = agent_bundle()
        self.upload(f"{self.host.state_dir}/bin/{bundle.filename}", bundle.data)
        COUNTERS.bump(self.host.name, "uploads")

    def _send_agent(self, session: AgentSession) -> None:
        """become: the bootstrap run by root asked for the agent on this channel (send_agent): the
        zip, then every request in flight again. It writes the zip into root's state dir only if its
        bytes have the sha256 it was started with (nothing the login user wrote is ever run by
        root), then runs it: one sudo per host."""
        session.retried = True
        try:
            session.chan.sendall(become.frame(agent_bundle().data))
        except self.LINK_ERRORS:
            pass  # the read that follows finds out why
        COUNTERS.bump(self.host.name, "uploads")
        tickets = list(session.queue)
        session.queue.clear()
        for ticket in tickets:
            self._write(session, ticket, again=True)

    def call(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """One request to this host's agent: the first call of the run starts it (one exec, through
        the verifying bootstrap), every later one is a line on the same channel. Requests held by
        submit() go out right behind it, before its answer is in."""
        with self.lock:
            ticket = Ticket(self, op, request, timeout)
            self._send([ticket, *self._take_held()])
            return self._answer_of(ticket)

    def ask(self, op: str, request: dict, timeout: float = 300) -> tuple[dict, Evidence]:
        """call(), with the requests submit() holds left held: they go out behind the step's own
        request, which needs this answer first (patch asks for the installed versions before it may
        write)."""
        with self.lock:
            ticket = Ticket(self, op, request, timeout)
            self._send([ticket])
            return self._answer_of(ticket)

    def submit(self, op: str, request: dict, timeout: float = 300) -> Ticket:
        """call(), pipelined (Connector.submit; read-only ops only): sent now, behind the requests
        in flight, or held and sent right behind the next request that goes out. Its answer is read
        in turn (the agent answers in request order) by result()."""
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
            # nothing went out before it (the step it followed made no call): now
            if ticket in self.held:
                self.held.remove(ticket)
                ticket.ahead = False
                self._send([ticket, *self._take_held()])
            elif ticket.stale:
                # A request of the step before it went out after it, so its answer may predate that
                # request's effect: ask again, in turn (the early answer is read and dropped on the
                # way).
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
        """Write the request lines on the live agent session (started if there is none: one exec),
        in order."""
        session = self._agent_session()
        for ticket in tickets:
            self._write(session, ticket)

    def _write(self, session: AgentSession, ticket: Ticket, again: bool = False) -> None:
        if ticket.id is None:
            self.requests += 1
            ticket.id = self.requests
        # a request of the step itself, after ones sent ahead: theirs may predate it
        if not ticket.ahead:
            for earlier in session.queue:
                earlier.stale = earlier.stale or earlier.ahead
        ahead = ticket.ahead and bool(session.queue)
        payload = (
            json.dumps(
                {
                    "protocol": PROTOCOL,
                    "op": ticket.op,
                    "state_dir": self.host.state_dir,
                    "operator": operator(),
                    **ticket.request,
                    "_id": ticket.id,
                }
            )
            + "\n"
        ).encode()
        ticket.session, ticket.sent = session, time.monotonic()
        session.queue.append(ticket)
        try:
            session.chan.sendall(payload)
        except self.LINK_ERRORS:
            # the read that follows finds out why (a refusal line, the agent's end, a lost link)
            pass
        if not again:
            COUNTERS.event(self.host.name, "sent_ahead" if ahead else "sent", ticket.op)

    def _answer_of(self, ticket: Ticket) -> tuple[dict, Evidence]:
        """Read answers in request order (keeping earlier tickets' answers on them) up to this
        ticket's."""
        deadline = time.monotonic() + ticket.timeout
        while not ticket.done:
            session = ticket.session
            if session is None or session is not self.session or not session.queue:
                raise TransportError(
                    "lost",
                    f"connection to {self.host.name} lost during the step; the node's "
                    "outcome is unknown",
                    Evidence(session.shown if session else "(agent)", None, [], 0.0),
                )
            self._read_next(session, ticket, deadline)
        if ticket.error is not None:
            raise ticket.error
        assert ticket.answer is not None and ticket.evidence is not None
        return ticket.answer, ticket.evidence

    def _read_next(self, session: AgentSession, waiting: Ticket, deadline: float) -> None:
        """The answer of the oldest request in flight, onto its ticket; when the session ends
        instead, every request in flight gets the error (the one waited for raises it; the others
        were sent ahead)."""
        head = session.queue[0]
        ends: tuple[type[BaseException], ...] = (Overflow, TimeoutError, *self.LINK_ERRORS)
        try:
            line = session.read_line(deadline)
        except ends as exc:
            self._fail(session, self._read_failed(session, waiting, head, exc))
            return
        if line is None:  # the agent ended instead of answering (refused, no interpreter, crashed)
            self._fail(session, self._ended_early(session, head))
            return
        fresh = session.answered == 0
        session.answered += 1
        answer, why = self._decode(line)
        if answer is None:
            self._end_session(session)
            self._fail(
                session,
                TransportError(
                    "remote",
                    f"{self.host.name}: {why}; its session is dropped and the "
                    "node's outcome is unknown",
                    session.evidence(None, head.sent),
                ),
            )
            return
        if answer.get("bootstrap") is True:  # nothing of ours ran; a next call starts afresh
            self._bootstrap_refused(session, head, answer, fresh)
            return
        self._deliver(session, head, answer)

    def _read_failed(
        self, session: AgentSession, waiting: Ticket, head: Ticket, exc: BaseException
    ) -> TransportError:
        """The session's end when its read fails: too much sent, no answer in time, a lost link.
        Each ends the session; its evidence is read where the order of the two matters."""
        if isinstance(exc, Overflow):
            evidence = session.evidence(None, head.sent)
            self._end_session(session)  # its channel closes: the node's agent goes with it
            return TransportError(
                "remote",
                f"{self.host.name}: {exc}; its session is dropped and the "
                "node's outcome is unknown (a fleetops agent never sends "
                f"that much: check what {self.host.python} runs on the "
                "node)",
                evidence,
            )
        if isinstance(exc, TimeoutError):
            # the agent's watchdog sees its client go and stops where it is
            self._end_session(session)
            return TransportError(
                "timeout",
                f"{self.host.name}: no answer within {waiting.timeout:.0f}s",
                session.evidence(None, head.sent),
            )
        evidence = session.evidence(None, head.sent)
        self.close()
        return TransportError(
            "lost",
            f"connection to {self.host.name} lost during the step "
            f"({exc or 'EOF'}); the node's outcome is unknown",
            evidence,
        )

    def _ended_early(self, session: AgentSession, head: Ticket) -> TransportError:
        """The agent ended instead of answering: a lost link, no interpreter, or its own failure."""
        self._end_session(session)
        code = session.code
        evidence = session.evidence(code, head.sent)
        if code is None or code == self.LINK_LOST_STATUS:
            self.close()
            return TransportError(
                "lost",
                f"connection to {self.host.name} lost during the step; the node's "
                "outcome is unknown",
                evidence,
            )
        if code == 127:
            return TransportError(
                "remote",
                f"{self.host.name}: the target python {self.host.python} was not found on the node",
                evidence,
            )
        return TransportError(
            "remote",
            f"{self.host.name}: the node agent failed (exit {code}) before it answered",
            evidence,
        )

    def _bootstrap_refused(
        self, session: AgentSession, head: Ticket, answer: dict, fresh: bool
    ) -> None:
        """The bootstrap refused before anything of ours ran: the agent is sent (through become)
        or uploaded (then every request in flight again) on a session's first answer, once;
        otherwise every request in flight fails as untrusted."""
        evidence = session.evidence(EXIT_BOOTSTRAP_REFUSED, head.sent)
        missing = fresh and answer.get("error_kind") == "agent_missing" and not session.retried
        if missing and answer.get("send_agent") is True and self.host.become:
            self._send_agent(session)
            return
        self._end_session(session)
        if missing and not self.host.become:
            # first visit of this agent version; then every request in flight again
            self.upload_agent()
            again = self._agent_session()
            again.retried = True
            for ticket in list(session.queue):
                self._write(again, ticket, again=True)
            session.queue.clear()
            return
        self._fail(
            session,
            TransportError("untrusted", f"{self.host.name}: {answer.get('error')}", evidence),
        )

    def _deliver(self, session: AgentSession, head: Ticket, answer: dict) -> None:
        """The answer onto the oldest ticket, or the session reset when it answers another."""
        evidence = session.evidence(0, head.sent)
        session.answered_one()
        if answer.get("_id") != head.id:
            self.close()
            self._fail(
                session,
                TransportError(
                    "remote",
                    f"{self.host.name}: the node agent answered out of turn "
                    f"(request {head.id}, answer {answer.get('_id')}); "
                    "connection reset",
                    evidence,
                ),
            )
            return
        session.queue.popleft()
        head.done, head.evidence = True, evidence
        if answer.get("agent_error"):
            head.error = TransportError(
                "remote",
                f"{self.host.name}: the node agent failed on {head.op}: "
                f"{answer.get('error')} (its traceback is in the node's stderr "
                "below; the agent goes on)",
                evidence,
            )
        else:
            head.answer = answer
        COUNTERS.event(self.host.name, "answered", head.op)

    def _decode(self, line: bytes) -> tuple[dict | None, str]:
        """One answer line as a dict, or None and why not. Its values are counted before json.loads
        makes them (a bound on the work of every parser after it)."""
        values = line.count(b",")  # commas in strings count too: a bound, not the number
        if values > MAX_ANSWER_VALUES:
            return None, (
                f"the node agent's answer holds more than {MAX_ANSWER_VALUES:,} values "
                f"({values:,} commas in {len(line):,} bytes), refused unread (a fleetops agent "
                f"never sends that many: check what {self.host.python} runs on the node)"
            )
        try:
            answer = json.loads(line.decode("utf-8"))
        # RecursionError: nested deeper than Python can
        except (ValueError, UnicodeDecodeError, RecursionError):
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
        if session is not None and (session.alive() or self._refused_before_asked(session)):
            return session
        if session is not None:
            self._end_session(session)
        self.open()
        argv, shown, sudo = self._agent_argv()
        chan = self._open_channel(argv, shown)
        ahead = b""
        if sudo is not None:
            try:
                ahead = become.handshake(
                    chan, self.host, sudo, shown, self.host.connect_timeout + 50
                )
            except self.LINK_ERRORS as exc:
                self.close()
                raise TransportError(
                    "lost",
                    f"connection to {self.host.name} lost while starting the agent "
                    f"({exc or 'EOF'})",
                    Evidence(shown, None, [], 0.0),
                ) from None
        self.session = AgentSession(chan, shown)
        self.session.out += ahead
        return self.session

    def _refused_before_asked(self, session: AgentSession) -> bool:
        """Whether this ended session's output is its agent's word to the first request: an agent
        started before any request (only the OpenSSH transport starts one: wire/warmstart.py) that
        refused to run, e.g. its zip gone from the node. Its refusal is read as a fresh session's
        (the zip uploaded, the agent started again), not thrown away unread."""
        return False

    def _end_session(self, session: AgentSession) -> None:
        if self.session is session:
            self.session = None
        try:
            session.chan.close()
        except self.LINK_ERRORS:
            pass
