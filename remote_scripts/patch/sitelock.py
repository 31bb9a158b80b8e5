"""The lock beside the patched files: one per site-packages directory, so every host whose python
resolves to the same files (a cluster venv on NFS, two inventory entries for one node) serializes on
it, whatever its own state dir. Stdlib only.

The lock is `<site-packages>/.fleetops-patch.lock`, taken with flock (NFS clients emulate it with
POSIX locks, so it holds across machines). Its content is a small JSON document, rewritten in place
by the holder only:
  holder   who holds it now (host, operator, op, pid, since): named to whoever has to wait
  unfinished  the sets being written, one entry each (op, host, pid, token, files): added before a
           set's first write, taken out once the set is whole again (written to its end, or put
           back). An entry still there when the next holder comes is a set whose writer died mid-way
           (SIGKILL, power loss); a run whose set covers every file of it reports it and finishes it
           in its own direction (patch and rollback are all-or-nothing). Sets of other playbooks
           sharing the venv leave it alone. (An older agent kept one such entry under `pending`; it
           is read as the first of the list.)
  outcomes  token → how a set with that token ended (written, put back after an interrupt): what the
           client that lost its answer asks for afterwards (patching.settle). The last OUTCOMES_KEPT
           are kept.
  files    path → the last form fleetops wrote there (patched/pristine), its sha256, by which host
           and when: how a second host knows "already applied (by <host>)".
The lock file lives in site-packages, beside the code it guards: whoever can forge it can already
change that code, so it is informational (who, when), never the proof of what a file should contain.
"""

from __future__ import annotations

import fcntl
import json
import os
import time

from ..core.nodeio import NodeError, now_iso
from ..core.sitemodules import site_roots

LOCK_NAME = ".fleetops-patch.lock"
OUTCOMES_KEPT = 32


def site_root_of(path: str) -> str:
    """The site-packages directory (of this interpreter) that holds `path` (already a real path)."""
    best = ""
    for root in site_roots():
        prefix = root.rstrip("/") + "/"
        if path.startswith(prefix) and len(root) > len(best):
            best = root
    if not best:
        raise NodeError(
            f"{path} is not inside this interpreter's site-packages; refusing to touch it",
            kind="outside_site",
        )
    return best


def _decode(raw: bytes) -> dict:
    try:
        value, _ = json.JSONDecoder().raw_decode(raw.decode("utf-8").lstrip())
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class SiteLock:
    """flock on the lock file of every site-packages directory a set touches (sorted: no deadlock);
    the state document lives in the first one."""

    def __init__(
        self, roots: list[str], host: str, operator: str, op: str, wait_s: float = 120.0
    ) -> None:
        self.paths = [os.path.join(r, LOCK_NAME) for r in sorted(set(roots))]
        self.who = {"host": host, "operator": operator, "op": op, "pid": os.getpid()}
        self.wait_s = wait_s
        self.fds: list[int] = []
        self.state: dict = {}
        self.waited_for: dict | None = None
        self._entry: dict | None = None  # this holder's own unfinished entry (begin)

    # -- the state document
    def _read(self, fd: int) -> dict:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return _decode(b"".join(chunks))

    def save(self) -> None:
        """Rewrite the state document in place (only the holder writes it; a reader that finds it
        torn treats it as empty: it names people, it proves nothing)."""
        data = (json.dumps(self.state, sort_keys=True) + "\n").encode()
        fd = self.fds[0]
        os.lseek(fd, 0, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
        os.fsync(fd)

    # -- lock / unlock
    def _open(self, path: str) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise NodeError(
                f"cannot open the venv's patch lock {path}: {exc.strerror}; the login user must be "
                f"able to write {os.path.dirname(path)} to patch the files in it",
                kind="site_lock",
            ) from None

    def __enter__(self) -> SiteLock:
        try:
            for path in self.paths:
                fd = self._open(path)
                self.fds.append(fd)
                self._take(fd, path)
            self.state = self._read(self.fds[0])
            self.state["holder"] = {**self.who, "since": now_iso()}
            self.save()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _take(self, fd: int, path: str) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                holder = self._read(fd).get("holder") or {}
                if holder:
                    self.waited_for = holder
                if time.monotonic() >= deadline:
                    raise NodeError(
                        f"the files in {os.path.dirname(path)} are being changed by "
                        f"{holder.get('host', '?')} ({holder.get('operator', '?')}, "
                        f"{holder.get('op', '?')}, pid {holder.get('pid', '?')}) since "
                        f"{holder.get('since', '?')}: waited {self.wait_s:.0f}s; try again when "
                        f"it finishes (the lock is {path}, shared by every host using this venv)",
                        kind="locked",
                        holder=holder,
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.fds:
            try:
                if self.state.get("holder", {}).get("pid") == os.getpid():
                    self.state.pop("holder", None)
                    self.save()
            except OSError:
                pass
        for fd in self.fds:
            os.close(fd)  # releases the flock
        self.fds = []

    # -- what the state says
    def unfinished(self) -> list[dict]:
        """Every set a dead holder was writing and never finished (we hold the lock: its writer is
        gone)."""
        entries = self.state.get("unfinished")
        out = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        legacy = self.state.get("pending")
        if isinstance(legacy, dict):
            out.insert(0, legacy)
        return out

    def interrupted(self, paths: list[str] | None = None) -> dict | None:
        """The first unfinished set that shares a file with `paths` (any set, when None)."""
        wanted = set(paths or ())
        for entry in self.unfinished():
            if paths is None or wanted & set(_paths(entry)):
                return entry
        return None

    def begin(self, op: str, files: list[dict], token: str | None = None) -> None:
        entry = {**self.who, "op": op, "at": now_iso(), "files": files}
        if token:
            entry["token"] = token
        self._entry = entry
        self._set_unfinished([*self.unfinished(), entry])
        self.save()

    def finish(
        self,
        written: dict[str, dict],
        covered: list[str] | None = None,
        token: str | None = None,
        outcome: str = "written",
    ) -> None:
        """The set is whole again: its own entry goes, and with `covered` (the set's paths, every
        file in its target form) so does every dead writer's entry whose files are all among them.
        Other sets' entries stay."""
        files = self.state.setdefault("files", {})
        if not isinstance(files, dict):
            files = self.state["files"] = {}
        for path, info in written.items():
            files[path] = {
                **info,
                "host": self.who["host"],
                "operator": self.who["operator"],
                "at": now_iso(),
            }
        whole = set(covered or ())
        self._set_unfinished(
            [
                e
                for e in self.unfinished()
                if not self._mine(e) and not (whole and set(_paths(e)) <= whole)
            ]
        )
        if token:
            self.record_outcome(
                token,
                {
                    "outcome": outcome,
                    "op": self.who["op"],
                    "at": now_iso(),
                    "files": {p: i.get("sha256") for p, i in written.items()},
                },
            )
        self.save()

    def record_outcome(self, token: str, outcome: dict) -> None:
        outcomes = self.state.get("outcomes")
        outcomes = {k: v for k, v in outcomes.items()} if isinstance(outcomes, dict) else {}
        outcomes.pop(token, None)
        outcomes[token] = outcome  # insertion order is age: the oldest go first
        while len(outcomes) > OUTCOMES_KEPT:
            outcomes.pop(next(iter(outcomes)))
        self.state["outcomes"] = outcomes

    def take_outcome(self, token: str) -> dict | None:
        outcomes = self.state.get("outcomes")
        if not isinstance(outcomes, dict) or not isinstance(outcomes.get(token), dict):
            return None
        found = outcomes.pop(token)
        self.save()
        return found

    def _mine(self, entry: dict) -> bool:
        return self._entry is not None and entry == self._entry

    def _set_unfinished(self, entries: list[dict]) -> None:
        self.state.pop("pending", None)
        if entries:
            self.state["unfinished"] = entries
        else:
            self.state.pop("unfinished", None)

    def last_writer(self, path: str, sha256: str) -> dict | None:
        """Who wrote this very file (its sha256 matches what they wrote), if fleetops did."""
        info = (self.state.get("files") or {}).get(path)
        return info if isinstance(info, dict) and info.get("sha256") == sha256 else None


def _paths(entry: dict) -> list[str]:
    return [
        f["path"]
        for f in entry.get("files") or ()
        if isinstance(f, dict) and isinstance(f.get("path"), str)
    ]
