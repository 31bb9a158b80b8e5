"""An SFTP (version 3) client over any byte pipe pair: what the OpenSSH transport uses on `ssh -s
HOST sftp` through the host's master, so files travel without paramiko. It gives the few calls
sftp.py and pythonpath.py make of paramiko's SFTPClient, with the same shapes (stat / lstat
attributes, OSError subclasses by errno, a file object with read / write / seek / prefetch), so
those modules serve both transports unchanged.

Reads and writes keep several requests in flight (a 50 ms link would otherwise pay one round trip
per 32 KiB). Every length the server sends is bounded before it is read: the node is not trusted to
be brief."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

INIT, VERSION, OPEN, CLOSE, READ, WRITE, LSTAT, FSTAT = 1, 2, 3, 4, 5, 6, 7, 8
MKDIR, REALPATH, STAT, READLINK = 14, 16, 17, 19
STATUS, HANDLE, DATA, NAME, ATTRS, EXTENDED = 101, 102, 103, 104, 105, 200
OK, EOF, NO_SUCH_FILE, PERMISSION_DENIED = 0, 1, 2, 3
ATTR_SIZE, ATTR_UIDGID, ATTR_PERMISSIONS, ATTR_ACMODTIME, ATTR_EXTENDED = 1, 2, 4, 8, 0x80000000
F_READ, F_WRITE, F_CREAT, F_TRUNC = 1, 2, 8, 0x10
CHUNK = 32768  # what every SFTP server must accept in one READ or WRITE
IN_FLIGHT = 32  # requests sent before the first answer is read
# the largest packet read from the server (OpenSSH's own limit is 256 KiB)
MAX_PACKET = 256 * 1024 + 1024
_ERRNO = {NO_SUCH_FILE: errno.ENOENT, PERMISSION_DENIED: errno.EACCES}


class SFTPError(OSError):
    """The server's refusal where SFTP names no errno (where it does, paramiko's OSError subclass is
    raised: FileNotFoundError, PermissionError)."""


@dataclass
class Attributes:
    st_size: int | None = None
    st_uid: int | None = None
    st_gid: int | None = None
    st_mode: int | None = None
    st_atime: int | None = None
    st_mtime: int | None = None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise EOFError("the SFTP server sent a packet shorter than its fields")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u32())

    def attrs(self) -> Attributes:
        flags = self.u32()
        out = Attributes()
        if flags & ATTR_SIZE:
            out.st_size = self.u64()
        if flags & ATTR_UIDGID:
            out.st_uid, out.st_gid = self.u32(), self.u32()
        if flags & ATTR_PERMISSIONS:
            out.st_mode = self.u32()
        if flags & ATTR_ACMODTIME:
            out.st_atime, out.st_mtime = self.u32(), self.u32()
        if flags & ATTR_EXTENDED:
            for _ in range(self.u32()):
                self.string()
                self.string()
        return out


def _string(value: bytes | str) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


class SFTPClient:
    """One SFTP session: `send(bytes)` writes to the server, `recv_exactly(n)` reads n bytes
    (EOFError at the end). Not thread-safe: a connector uses it under its own lock, one request
    stream at a time."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        recv_exactly: Callable[[int], bytes],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._send, self._recv = send, recv_exactly
        self._on_close = on_close
        self._next = 0
        self.extensions: dict[bytes, bytes] = {}
        self._packet(INIT, struct.pack(">I", 3), with_id=False)
        kind, body = self._read_packet()
        if kind != VERSION:
            raise EOFError(f"the SFTP server answered INIT with packet type {kind}")
        reader = _Reader(body)
        reader.u32()
        while reader.at < len(body):
            name = reader.string()
            self.extensions[name] = reader.string()

    # -- packets
    def _packet(self, kind: int, body: bytes, with_id: bool = True) -> int:
        rid = 0
        if with_id:
            self._next = (self._next + 1) & 0xFFFFFFFF
            rid = self._next
            body = struct.pack(">I", rid) + body
        self._send(struct.pack(">IB", len(body) + 1, kind) + body)
        return rid

    def _read_packet(self) -> tuple[int, bytes]:
        (length,) = struct.unpack(">I", self._recv(4))
        if length < 1 or length > MAX_PACKET:
            raise EOFError(
                f"the SFTP server sent a packet of {length} bytes (at most {MAX_PACKET})"
            )
        raw = self._recv(length)
        return raw[0], raw[1:]

    def _answer(self, rid: int, path: str = "") -> tuple[int, _Reader]:
        kind, body = self._read_packet()
        reader = _Reader(body)
        got = reader.u32()
        if got != rid:
            raise EOFError(f"the SFTP server answered request {got} where {rid} was next")
        if kind == STATUS:
            code = reader.u32()
            if code not in (OK, EOF):
                message = (
                    reader.string().decode("utf-8", "replace") if reader.at < len(body) else ""
                )
                number = _ERRNO.get(code)
                if number is not None:  # OSError(errno, ...) is FileNotFoundError / PermissionError
                    raise OSError(number, os.strerror(number), path)
                raise SFTPError(
                    f"{message or 'failure'} (SFTP status {code})" + (f": {path}" if path else "")
                )
        return kind, reader

    def _request(self, kind: int, body: bytes, path: str = "") -> tuple[int, _Reader]:
        return self._answer(self._packet(kind, body), path)

    def _expect(self, kind: int, body: bytes, want: int, path: str) -> _Reader:
        got, reader = self._request(kind, body, path)
        if got != want:
            raise SFTPError(errno.EIO, f"unexpected SFTP answer {got}", path)
        return reader

    # -- paramiko's SFTPClient names
    def stat(self, path: str) -> Attributes:
        return self._expect(STAT, _string(path), ATTRS, path).attrs()

    def lstat(self, path: str) -> Attributes:
        return self._expect(LSTAT, _string(path), ATTRS, path).attrs()

    def normalize(self, path: str) -> str:
        reader = self._expect(REALPATH, _string(path), NAME, path)
        if reader.u32() < 1:
            raise SFTPError(errno.EIO, "REALPATH named nothing", path)
        return reader.string().decode("utf-8", "surrogateescape")

    def readlink(self, path: str) -> str | None:
        reader = self._expect(READLINK, _string(path), NAME, path)
        return reader.string().decode("utf-8", "surrogateescape") if reader.u32() >= 1 else None

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        self._request(MKDIR, _string(path) + struct.pack(">II", ATTR_PERMISSIONS, mode), path)

    def posix_rename(self, old: str, new: str) -> None:
        if b"posix-rename@openssh.com" not in self.extensions:
            raise SFTPError(errno.ENOTSUP, "the SFTP server has no posix-rename", new)
        self._request(
            EXTENDED, _string("posix-rename@openssh.com") + _string(old) + _string(new), new
        )

    def open(self, path: str, mode: str = "rb") -> SFTPFile:
        flags = F_READ if "r" in mode else F_WRITE | F_CREAT | F_TRUNC
        reader = self._expect(OPEN, _string(path) + struct.pack(">II", flags, 0), HANDLE, path)
        return SFTPFile(self, reader.string(), path)

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


class SFTPFile:
    """An open remote file: read / write from a position, several requests in flight."""

    def __init__(self, client: SFTPClient, handle: bytes, path: str) -> None:
        self.client, self.handle, self.path = client, handle, path
        self.pos = 0
        self.closed = False

    def __enter__(self) -> SFTPFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def seek(self, offset: int) -> None:
        self.pos = offset

    def prefetch(
        self, file_size: int | None = None, max_concurrent_requests: int | None = None
    ) -> None:
        """paramiko's read-ahead: here every read() already keeps IN_FLIGHT requests out."""

    def read(self, size: int | None = None) -> bytes:
        """Up to `size` bytes from the position (all that is left when None); fewer only at the
        file's end."""
        out = bytearray()
        pending: list[tuple[int, int]] = []  # (request id, its length), oldest first
        asked = self.pos
        at_end = False
        while True:
            while (
                not at_end
                and len(pending) < IN_FLIGHT
                and (size is None or asked < self.pos + size)
            ):
                want = CHUNK if size is None else min(CHUNK, self.pos + size - asked)
                body = _string(self.handle) + struct.pack(">QI", asked, want)
                pending.append((self.client._packet(READ, body), want))
                asked += want
            if not pending:
                break
            rid, want = pending.pop(0)
            kind, reader = self.client._answer(rid, self.path)
            if kind == STATUS:  # EOF: nothing at or after this offset
                at_end = True
                continue
            if kind != DATA:
                raise SFTPError(errno.EIO, f"unexpected SFTP answer {kind}", self.path)
            data = reader.string()
            if at_end:
                continue  # an answer to a read sent before the end was seen
            out += data
            # a short read: ask again from where it stopped, after what is in flight
            if len(data) < want:
                for later_rid, _ in pending:
                    self.client._answer(later_rid, self.path)
                pending = []
                asked = self.pos + len(out)
        self.pos += len(out)
        return bytes(out)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        pending: list[int] = []
        offset = 0
        while offset < len(view) or pending:
            while offset < len(view) and len(pending) < IN_FLIGHT:
                piece = bytes(view[offset : offset + CHUNK])
                body = _string(self.handle) + struct.pack(">Q", self.pos + offset) + _string(piece)
                pending.append(self.client._packet(WRITE, body))
                offset += len(piece)
            self.client._answer(pending.pop(0), self.path)
        self.pos += len(view)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client._request(CLOSE, _string(self.handle), self.path)


def over_pipes(
    stdin: IO[bytes], stdout: IO[bytes], on_close: Callable[[], None] | None = None
) -> SFTPClient:
    """An SFTPClient on a process's stdin and stdout (blocking: the server answers every
    request)."""

    def send(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    def recv_exactly(n: int) -> bytes:
        data = stdout.read(n)
        if data is None or len(data) < n:
            raise EOFError("the SFTP server closed the session")
        return data

    return SFTPClient(send, recv_exactly, on_close)
