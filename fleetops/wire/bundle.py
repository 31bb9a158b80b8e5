"""The node agent as one content-addressed zip: same code → same bytes → same name, so a node that
already has it is never sent it again."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import marshal
import os
import threading
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import remote_scripts

# How the node runs the agent, trusting nothing it finds there (issue 12). The client sends BOOTSTRAP as
# `python -c BOOTSTRAP <state_dir> <state_dir>/bin/<name>.pyz <sha256>`: argv words, never shell built from
# data. Before any agent code is imported it checks, like OpenSSH's StrictModes, that the state dir (and the
# directories above it), bin/ and the zip are owned by the connecting user or root, writable by no one else,
# and not symlinks; then it reads the zip's bytes ONCE, checks their sha256 against the one the client
# expects, and imports the agent from those very bytes (no verify-then-reopen window, no unpacked copy on
# disk to swap). A refusal is one JSON line {"bootstrap": true, "error_kind": ..., "error": ...}, exit 3:
# agent_missing (the client uploads it), untrusted_state or agent_mismatch (the client reports it).
# ENTRY (the zip's __main__, for the long-running roles `agent.pyz wrap|extract ...` that jobs start) does
# the same checks on its own file, against the sha256 its parent agent passed down (or the name's prefix).
_LOADER = r"""import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import marshal, os, stat, struct, zlib
try:  # the small built-in sha256: hashlib's OpenSSL module costs ~4 ms of CPU to load, at every agent start
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
from importlib.machinery import ModuleSpec
EXIT_REFUSED = 3
def refuse(kind, msg, **extra):
    import json  # only here: json imports re, enum and functools, ~9 ms of every agent start
    sys.stdout.write(json.dumps(dict(ok=False, bootstrap=True, error_kind=kind, error=msg, **extra)) + "\n")
    sys.stdout.flush()
    sys.exit(EXIT_REFUSED)
def untrusted(path, why, st, fix):
    mode = "%04o" % (st.st_mode & 0o7777)
    refuse("untrusted_state", "refusing to run the agent: %s %s [mode %s (%s), owner uid %d]; %s"
           % (path, why, stat.filemode(st.st_mode), mode, st.st_uid, fix), path=path, mode=mode, uid=st.st_uid)
def trust(path, is_dir, st=None):
    uid = os.geteuid()
    st = st or os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        untrusted(path, "is a symlink (to %s); fleetops never follows symlinks in its state dir" % os.readlink(path),
                  st, "remove it (rm %s) and run again" % path)
    if st.st_uid not in (uid, 0):
        untrusted(path, "is owned by uid %d, not by the connecting user (uid %d) or root" % (st.st_uid, uid), st,
                  "check who changed it, then chown %d %s (or remove it) and run again" % (uid, path))
    if st.st_mode & 0o022:
        untrusted(path, "is writable by group or others", st, "check who changed it, then chmod go-w %s and run "
                  "again" % path)
    if stat.S_ISDIR(st.st_mode) != is_dir:
        untrusted(path, "is not a %s" % ("directory" if is_dir else "regular file"), st,
                  "move it aside (mv %s %s.moved) and run again" % (path, path))
def trust_parents(path):
    uid, real = os.geteuid(), os.path.realpath(os.path.dirname(path))
    while True:
        try:
            st = os.stat(real)
        except FileNotFoundError:  # not made yet (a first visit): the upload makes it, 0700
            st = None
        if st is not None and (st.st_uid not in (uid, 0) or st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            untrusted(real, "(a directory above the state dir) is writable by others or owned by another user", st,
                      "make it writable by its owner (root or uid %d) alone, or choose another state_dir" % uid)
        if real == "/":
            return
        real = os.path.dirname(real)
def members(data):
    # The zip's members, read from its central directory: the bytes are already verified, and agent_bundle
    # writes only stored or deflated members, no zip64. (zipfile's import alone cost ~10 ms per start.)
    end = data.rfind(b"PK\x05\x06")
    count, _, pos = struct.unpack_from("<HII", data, end + 10)
    for _ in range(count):
        method, size = struct.unpack_from("<H", data, pos + 10)[0], struct.unpack_from("<I", data, pos + 20)[0]
        nlen, xlen, clen = struct.unpack_from("<HHH", data, pos + 28)
        local = struct.unpack_from("<I", data, pos + 42)[0]
        name = data[pos + 46:pos + 46 + nlen].decode("utf-8")
        pos += 46 + nlen + xlen + clen
        start = local + 30 + sum(struct.unpack_from("<HH", data, local + 26))
        yield name, (method, data[start:start + size])
def inflate(member):
    # Only the members an op imports are inflated (a verify imports a third of them): the bytes were verified
    # as a whole already.
    method, raw = member
    return zlib.decompress(raw, -15) if method == 8 else raw
def load(state_dir, pyz, want):
    try:
        trust_parents(state_dir)
        for path in (state_dir, os.path.dirname(pyz)):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                refuse("agent_missing", "%s does not exist yet" % path)
            trust(path, True, st)
        try:
            fd = os.open(pyz, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            refuse("agent_missing", "%s does not exist yet" % pyz)
        except OSError:
            trust(pyz, False)  # a symlink: refused, named
            raise
        with os.fdopen(fd, "rb") as f:
            trust(pyz, False, os.fstat(f.fileno()))
            data = f.read()
    except OSError as exc:
        refuse("untrusted_state", "cannot check the state dir %s: %s; check its permissions" % (state_dir, exc))
    got = sha256(data).hexdigest()
    if not want or (got != want and not (len(want) < 64 and got.startswith(want))):
        refuse("agent_mismatch", "%s is not the agent fleetops sent (sha256 %s, expected %s): something on the "
               "node changed it; refusing to run it. Check who did, remove it (rm %s) and run again: fleetops "
               "uploads a fresh copy" % (pyz, got, want, pyz), path=pyz, sha256=got, expected=want)
    files, codes = {}, {}
    compiled = "code-%s/" % sys.modules["_frozen_importlib_external"].MAGIC_NUMBER.hex()
    for name, source in members(data):
        if name.startswith("remote_scripts/") and name.endswith(".py"):
            mod, pkg = name[:-3].replace("/", "."), name.endswith("/__init__.py")
            files[mod[:-9] if pkg else mod] = (source, "%s/%s" % (pyz, name), pkg)
        elif name.startswith(compiled):  # compiled by a client of this very Python version: no compile here
            codes[name[len(compiled):]] = source
    class Agent:
        def find_spec(self, name, path=None, target=None):
            if name not in files:
                return None
            spec = ModuleSpec(name, self, origin=files[name][1], is_package=files[name][2])
            spec.has_location = True
            return spec
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            name = module.__spec__.name
            source, origin, _ = files[name]
            code = codes.get(name)
            exec(marshal.loads(inflate(code)) if code is not None
                 else compile(inflate(source), origin, "exec", dont_inherit=True), module.__dict__)
        def get_source(self, name):
            return inflate(files[name][0]).decode("utf-8")
    sys.meta_path.insert(0, Agent())
    os.environ["FLEETOPS_AGENT_SHA256"] = got
"""

EXIT_BOOTSTRAP_REFUSED = 3  # EXIT_REFUSED in _LOADER
BOOTSTRAP = _LOADER + """load(*sys.argv[1:4])
sys.argv[:] = [sys.argv[2]]
from remote_scripts.agent import serve_and_exit
serve_and_exit()
"""

ENTRY = (_LOADER + """pyz = os.path.abspath(sys.argv[0])
sys.path[:] = [p for p in sys.path if os.path.abspath(p) != pyz]
sys.path_importer_cache.pop(sys.argv[0], None)
name = os.path.basename(pyz)
prefix = name[len("fleetops-agent-"):-len(".pyz")] if name.startswith("fleetops-agent-") else ""
want = os.environ.get("FLEETOPS_AGENT_SHA256", "")
load(os.path.dirname(os.path.dirname(pyz)), pyz, want if want.startswith(prefix) and prefix else prefix)
from remote_scripts.agent import main
sys.exit(main())
""").encode()


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def filename(self) -> str:
        return f"fleetops-agent-{self.sha256[:20]}.pyz"


# The agent's modules also travel compiled by the client's Python (marshal version 2: no object references, so
# the same source gives the same bytes in any client process, and the bundle's name stays put). A node running
# the same Python version execs them without compiling (~55 ms of CPU per agent start, measured); any other
# version compiles the sources, as before. Both come from the same sha256-verified bytes.
CODE_PREFIX = f"code-{importlib.util.MAGIC_NUMBER.hex()}/"
CODE_FILENAME = "<fleetops-agent>/remote_scripts/{}"  # what a traceback names for precompiled agent code
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleetops" / "agent"


_BUILDING = threading.Lock()  # hosts connect in parallel: the first builds, the others wait for it


def agent_bundle() -> Bundle:
    with _BUILDING:
        return _agent_bundle()


@lru_cache(maxsize=1)
def _agent_bundle() -> Bundle:
    """The zip, from a cache keyed by the sources and this Python's bytecode version when it can (compiling
    every module costs the client ~0.1 s per run otherwise)."""
    source_dir = Path(remote_scripts.__file__).parent
    sources = {p.name: p.read_bytes() for p in sorted(source_dir.glob("*.py")) if p.name != "__main__.py"}
    key = hashlib.sha256(b"".join(hashlib.sha256(n.encode() + b"\0" + d).digest() for n, d in sources.items())
                         + ENTRY + CODE_PREFIX.encode()).hexdigest()[:32]
    cached = CACHE_DIR / f"{key}.pyz"
    try:
        data = cached.read_bytes()
        if _sources_of(data) == sources:  # a cache file is believed only for the sources it carries
            return Bundle(data, hashlib.sha256(data).hexdigest())
    except (OSError, ValueError, zipfile.BadZipFile):
        pass
    data = _build(sources)
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    except OSError:
        pass  # no cache (read-only home): build it again next run
    return Bundle(data, hashlib.sha256(data).hexdigest())


def _sources_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n[len("remote_scripts/"):]: zf.read(n) for n in zf.namelist()
                if n.startswith("remote_scripts/") and n.endswith(".py")}


def _build(sources: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)

        add("__main__.py", ENTRY)
        for name, source in sources.items():
            add(f"remote_scripts/{name}", source)
        for name, source in sources.items():
            module = "remote_scripts" if name == "__init__.py" else f"remote_scripts.{name[:-3]}"
            code = compile(source, CODE_FILENAME.format(name), "exec", dont_inherit=True)
            add(f"{CODE_PREFIX}{module}", marshal.dumps(code, 2))
    return buf.getvalue()
