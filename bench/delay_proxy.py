"""A userspace TCP delay proxy for the benchmark (this kernel has no netem), loopback only.

    python3 bench/delay_proxy.py --rtt-ms 50 UPSTREAM_PORT [UPSTREAM_PORT ...]
    # the large lab's hosts:
    python3 bench/delay_proxy.py --rtt-ms 50 127.77.0.1:PORT 127.77.0.2:PORT ...

For each upstream port (an sshd on 127.0.0.1, or ADDRESS:PORT on another loopback address) it
listens on a fresh 127.0.0.1 port, prints one JSON line {"listen": {"<upstream as given>": <proxy
port>, ...}, "pid": ...} once every listener is up, then serves until SIGTERM/SIGINT. Each chunk
read from either side is written to the other side RTT/2 after it was read (order kept per
direction), so a request/answer turn costs one RTT. A new connection starts one RTT late (the TCP
handshake): the proxy accepts at once, waits one RTT, then connects upstream; what the client sent
meanwhile counts as sent when the handshake would have finished, and then takes its RTT/2 like any
chunk.

On SIGUSR1 it prints one JSON line {"connections": N, "turns": T} (totals since start, every
listener): T counts request/answer turns, each time the server speaks after the client has spoken
since the server last did, so requests sent ahead of an answer (pipelined) make one turn; the
difference of two such lines around a command is its round trips on the wire (a new connection's
TCP handshake counted in N, not T). --log FILE writes one line per chunk read: the monotonic clock
(time.monotonic() in any process here), connection number, `>` (client to server) or `<`,
bytes: a run's turns in order.

Only 127.0.0.0/8 is ever listened on or connected to: anything else is refused at start.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import signal
import sys
from typing import IO

CHUNK = 65536


def loopback(address: str) -> str:
    if not ipaddress.ip_address(address).is_loopback or ipaddress.ip_address(address).version != 4:
        raise SystemExit(f"delay_proxy: refusing non-loopback address {address!r}")
    return address


class Proxy:
    def __init__(
        self, rtt: float, upstream_host: str, upstream_port: int, log: IO[str] | None = None
    ) -> None:
        self.log = log
        self.half = rtt / 2.0
        self.rtt = rtt
        self.upstream = (loopback(upstream_host), upstream_port)
        self.connections = 0
        self.turns = 0
        # Every task of every connection, held until it is done: asyncio keeps only weak references
        # to tasks, and the stream protocol drops its reference to a connection's task when the
        # client resets it (Python 3.11), so a task still waiting out its delay was collected ("Task
        # was destroyed but it is pending!", then "cannot reuse already awaited coroutine"),
        # hundreds of times in an N = 128 run.
        self.live: set[asyncio.Future] = set()

    def _hold(self, task: asyncio.Future) -> asyncio.Future:
        self.live.add(task)
        task.add_done_callback(self.live.discard)
        return task

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        self._hold(asyncio.current_task())  # type: ignore[arg-type]
        self.connections += 1
        number = self.connections
        established = loop.time() + self.rtt  # when the client's handshake would have completed
        to_server: asyncio.Queue = asyncio.Queue()
        to_client: asyncio.Queue = asyncio.Queue()
        # Read from the client right away (the bytes sit "on the wire"), stamped no earlier than the
        # handshake.
        spoke = [False]  # the client has sent since the server last did
        tasks = [
            self._hold(
                asyncio.ensure_future(
                    self._read(client_r, to_server, established, spoke, number, True)
                )
            )
        ]
        server_w = None
        try:
            if self.rtt:
                await asyncio.sleep(max(0.0, established - loop.time()))
            server_r, server_w = await asyncio.open_connection(*self.upstream)
            tasks += [
                self._hold(asyncio.ensure_future(work))
                for work in (
                    self._read(server_r, to_client, 0.0, spoke, number, False),
                    self._write(to_server, server_w),
                    self._write(to_client, client_w),
                )
            ]
            await asyncio.gather(*tasks)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a reset, or the proxy shutting down
        finally:
            # whatever is still running of this connection (a no-op for the finished)
            for task in tasks:
                task.cancel()
            for w in (client_w, server_w):
                if w is not None:
                    w.close()

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue,
        not_before: float,
        spoke: list[bool],
        number: int,
        client: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(CHUNK)
                if self.log is not None:
                    print(
                        f"{loop.time():.4f} {number} {'>' if client else '<'} {len(data)}",
                        file=self.log,
                        flush=True,
                    )
                if data and client:
                    spoke[0] = True
                elif data and spoke[0]:
                    spoke[0] = False
                    self.turns += 1
                due = max(loop.time(), not_before) + self.half
                await queue.put((due, data))
                if not data:
                    return
        except OSError:
            await queue.put((loop.time(), b""))

    async def _write(self, queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
            except OSError:
                return


def upstream(spec: str, host: str) -> tuple[str, int]:
    """`PORT` (on --host) or `ADDRESS:PORT`, a loopback address either way."""
    address, _, port = spec.rpartition(":")
    return loopback(address or host), int(port)


def raise_open_files(needed: int) -> None:
    """A thousand listeners and two sockets per connection: the soft open-file limit raised to fit,
    if it can."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (needed if hard == resource.RLIM_INFINITY else min(needed, hard), hard),
        )


async def serve(rtt: float, ports: list[str], host: str, log: IO[str] | None = None) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    servers, mapping, proxies = [], {}, []
    raise_open_files(len(ports) + 4096)
    for spec in ports:
        address, port = upstream(spec, host)
        proxy = Proxy(rtt, address, port, log)
        proxies.append(proxy)
        server = await asyncio.start_server(proxy.handle, host, 0, backlog=1024)
        servers.append(server)
        mapping[spec] = server.sockets[0].getsockname()[1]
    loop.add_signal_handler(
        signal.SIGUSR1,
        lambda: print(
            json.dumps(
                {
                    "connections": sum(p.connections for p in proxies),
                    "turns": sum(p.turns for p in proxies),
                }
            ),
            flush=True,
        ),
    )
    print(json.dumps({"listen": mapping, "pid": os.getpid()}), flush=True)
    await stop
    for server in servers:
        server.close()
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rtt-ms", type=float, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log", help="one line per chunk read, appended to this file")
    ap.add_argument("ports", nargs="+", help="upstream ports on --host, or ADDRESS:PORT (loopback)")
    args = ap.parse_args()
    loopback(args.host)
    try:
        log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
        asyncio.run(serve(args.rtt_ms / 1000.0, args.ports, args.host, log))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
