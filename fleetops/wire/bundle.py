"""The node agent as one content-addressed zip: same code → same bytes → same name, so a node that
already has it is never sent it again."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import marshal
import os
import sys
import threading
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..agent.core.bootstrap import ALLOW_INSECURE_VENV, EXIT_REFUSED, PYTHON_FLAGS

if TYPE_CHECKING:
    import ast  # imported where it is used: only building the bundle parses the bootstrap

    # importlib.resources.abc is Python 3.11's; the client runs on 3.10 too
    from importlib.resources.abc import Traversable

__all__ = [
    "ALLOW_INSECURE_VENV",
    "BOOTSTRAP",
    "EXIT_BOOTSTRAP_REFUSED",
    "PYTHON_FLAGS",
    "Bundle",
    "agent_bundle",
]

# How the node runs the agent, trusting nothing it finds there: remote_scripts/core/bootstrap.py,
# whose text the client sends as `python -I -S -c BOOTSTRAP <state_dir> <state_dir>/bin/<name>.pyz
# <sha256> [--allow-insecure-venv]` (argv words, never shell built from data). It checks the
# interpreter (executable, prefixes, sys.path, site-packages and their .pth files, before `site`
# runs) and the state dir's whole path as written, like OpenSSH's StrictModes, reads the zip's bytes
# once, checks their sha256 and imports the agent from those bytes. The agent starts its own
# long-running processes (job keeper, extract, the Slurm step, verify's probe) through the same
# text, which it holds in the verified zip (bootstrap.relaunch). A refusal is one JSON line
# {"bootstrap": true, "error_kind": ..., "error": ...}, exit 3: agent_missing (the client uploads
# it), untrusted_state, untrusted_venv or agent_mismatch (the client reports it). The agent's
# sources as the client holds them: fleetops.agent, which is remote_scripts/ in the checkout
# (fleetops/agent links there) and a package of its own in the wheel; read as the package's
# resources, so either layout (or a zipped install) gives the same text.
AGENT = resources.files("fleetops.agent")
BOOTSTRAP = AGENT.joinpath("core", "bootstrap.py").read_text(encoding="utf-8")
EXIT_BOOTSTRAP_REFUSED = EXIT_REFUSED

# How the client starts the bootstrap: `python -I -S -c LAUNCHER TAG CODE SOURCE <the bootstrap's
# words>`. The bootstrap's ~450 lines cost ~7 ms of node CPU to compile at every agent start, so it
# also travels compiled by the client's Python (CODE); a node whose Python is that very one (TAG:
# implementation and exact version, so the same bytecode) runs it without compiling, any other
# compiles SOURCE (the same text, its comments and docstrings blanked where they stand: lean_source)
# as before. Both are the client's own argv words, never read from the node; zlib and base64 keep
# them ~21 KB together (the login shell parses them too). The three words are gone from sys.argv
# before the bootstrap reads it. Written for any Python a node may have, so an old one still gets
# the bootstrap's own refusal (python_too_old).
LAUNCHER = """import sys, zlib, binascii
fleetops_tag, fleetops_code, fleetops_source = sys.argv[1:4]
del sys.argv[1:4]
if fleetops_tag == "%s-%x" % (getattr(getattr(sys, "implementation", None), "cache_tag", None), \
sys.hexversion):
    import marshal
    FLEETOPS_SAME_PYTHON = True
    exec(marshal.loads(zlib.decompress(binascii.a2b_base64(fleetops_code))))
else:
    exec(compile(zlib.decompress(binascii.a2b_base64(fleetops_source)), "<fleetops bootstrap>", \
"exec"))
"""


@lru_cache(maxsize=1)
def launch_words() -> tuple[str, ...]:
    """`-c LAUNCHER TAG CODE SOURCE`: what starts the bootstrap (made once per run, while
    connecting; kept in the cache beside the zip's, since making them costs the client ~70 ms of
    CPU, a child interpreter's included)."""
    tag = f"{sys.implementation.cache_tag}-{sys.hexversion:x}"
    # what the words are made from: the bootstrap's text, this Python, how the child compiles it
    digest = hashlib.sha256(
        f"{tag}\0{COMPILE_BOOTSTRAP}\0".encode() + BOOTSTRAP.encode("utf-8")
    ).hexdigest()
    cached = CACHE_DIR / f"launch-{digest[:32]}.json"
    try:
        kept = json.loads(cached.read_text(encoding="utf-8"))
        if (
            kept.get("bootstrap") == digest
            and isinstance(kept.get("code"), str)
            and isinstance(kept.get("source"), str)
        ):
            return ("-c", LAUNCHER, tag, kept["code"], kept["source"])
    except (OSError, ValueError, AttributeError):
        pass
    code, source = _launch_code(), _pack(lean_source(BOOTSTRAP).encode("utf-8"))
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps({"bootstrap": digest, "code": code, "source": source}), encoding="utf-8"
        )
        os.replace(tmp, cached)
    except OSError:
        pass  # no cache (read-only home): made again next run
    return ("-c", LAUNCHER, tag, code, source)


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


# This very Python compiling the bootstrap without column positions (-X no_debug_ranges, 3.11+: a
# traceback keeps its line numbers, loses only its carets): ~6 KB less per agent start. optimize=2
# drops the docstrings (the bootstrap has no assert); a refusal's text is built at run time.
COMPILE_BOOTSTRAP = (
    "import sys, marshal\ncode = compile(sys.stdin.read(), '<fleetops bootstrap>', 'exec', "
    "dont_inherit=True, optimize=2)\nsys.stdout.write('%s-%x\\n' % "
    "(sys.implementation.cache_tag, sys.hexversion))\nsys.stdout.flush()\n"
    "sys.stdout.buffer.write(marshal.dumps(code))\n"
)


def _launch_code() -> str:
    """The bootstrap compiled for a node of this very Python; made once per bootstrap text
    (launch_words keeps it), in a child interpreter because the column positions can only be left
    out at an interpreter's start. Where that child cannot run, or is not this Python, compiled here
    with them."""
    tag = f"{sys.implementation.cache_tag}-{sys.hexversion:x}"
    if sys.version_info >= (3, 11):
        import subprocess

        try:
            made = subprocess.run(
                [sys.executable, "-I", "-X", "no_debug_ranges", "-c", COMPILE_BOOTSTRAP],
                input=BOOTSTRAP.encode("utf-8"),
                capture_output=True,
                timeout=60,
            )
            head, _, code = made.stdout.partition(b"\n")
            if made.returncode == 0 and head.decode("ascii", "replace") == tag:
                return _pack(code)
        except (OSError, subprocess.SubprocessError):
            pass
    return _pack(
        marshal.dumps(
            compile(BOOTSTRAP, "<fleetops bootstrap>", "exec", dont_inherit=True, optimize=2)
        )
    )


def _docstring(node: ast.AST) -> ast.Expr | None:
    """The docstring statement of a module, class or function; None for other nodes or none."""
    import ast

    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    doc = node.body[0] if node.body else None
    if not isinstance(doc, ast.Expr) or not isinstance(doc.value, ast.Constant):
        return None
    return doc if isinstance(doc.value.value, str) else None


def _blank_docstring(lines: list[str], doc: ast.Expr, alone: bool) -> None:
    """The docstring's lines blanked (`pass` in its place when it is the body's only statement),
    unless it shares a line with code."""
    first, last = doc.lineno - 1, (doc.end_lineno or doc.lineno) - 1
    if lines[first][: doc.col_offset].strip() or lines[last][doc.end_col_offset or 0 :].strip():
        return
    lines[first] = lines[first][: doc.col_offset] + "pass\n" if alone else "\n"
    for i in range(first + 1, last + 1):
        lines[i] = "\n"


def lean_source(text: str) -> str:
    """The bootstrap's text as a node of another Python compiles it: comments and docstrings blanked
    where they stand, so it travels ~4 KB smaller and every line of code keeps its line number (a
    traceback still points into bootstrap.py). A docstring that shares a line with code is left as
    it is."""
    import ast
    import tokenize

    lines = text.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    for node in ast.walk(ast.parse(text)):
        doc = _docstring(node)
        if doc is not None:
            _blank_docstring(lines, doc, alone=len(getattr(node, "body", [])) == 1)
    return "".join(line if line.strip() else "\n" for line in lines)


# The zip's __main__: nothing of fleetops runs the zip by its path (Python would run whatever the
# path names when it opens it); one who tries is told how fleetops runs it.
ENTRY = (
    b"import sys\nsys.exit('the fleetops agent runs only through its verifying bootstrap "
    b"(remote_scripts/core/bootstrap.py), never by path')\n"
)


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def filename(self) -> str:
        return f"fleetops-agent-{self.sha256[:20]}.pyz"


# The agent's modules also travel compiled by the client's Python (marshal version 2: no object
# references, so the same source gives the same bytes in any client process, and the bundle's name
# stays put). A node running the same Python version execs them without compiling (~55 ms of CPU per
# agent start, measured); any other version compiles the sources, as before. Both come from the same
# sha256-verified bytes.
CODE_PREFIX = f"code-{importlib.util.MAGIC_NUMBER.hex()}/"
# Before 3.11 marshal writes a frozenset constant (`x in {...}`) in its hash order, which changes
# with each process's hash seed: a client on 3.10 sends the sources alone, so its bundle's bytes
# stay put too.
PRECOMPILED = sys.version_info >= (3, 11)
# what a traceback names for precompiled agent code
CODE_FILENAME = "<fleetops-agent>/remote_scripts/{}"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleetops" / "agent"


_BUILDING = threading.Lock()  # hosts connect in parallel: the first builds, the others wait for it


def agent_bundle() -> Bundle:
    with _BUILDING:
        return _agent_bundle()


@lru_cache(maxsize=1)
def _agent_bundle() -> Bundle:
    """The zip, from a cache keyed by the sources and this Python's bytecode version when it can
    (compiling every module costs the client ~0.1 s per run otherwise)."""
    sources = agent_sources()
    key = hashlib.sha256(
        b"".join(hashlib.sha256(n.encode() + b"\0" + d).digest() for n, d in sources.items())
        + ENTRY
        + CODE_PREFIX.encode()
    ).hexdigest()[:32]
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


def agent_sources() -> dict[str, bytes]:
    """Every module of the agent, by its path under remote_scripts/ ("core/agent.py"), its
    subpackages included; the package's own __main__ (`python remote_scripts`) stays out of the
    zip."""
    found: list[tuple[tuple[str, ...], bytes]] = []

    def walk(folder: Traversable, parts: tuple[str, ...]) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name != "__pycache__":
                    walk(entry, (*parts, entry.name))
            elif entry.name.endswith(".py") and entry.name != "__main__.py":
                found.append(((*parts, entry.name), entry.read_bytes()))

    walk(AGENT, ())
    return {"/".join(parts): data for parts, data in sorted(found)}


def _sources_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {
            n[len("remote_scripts/") :]: zf.read(n)
            for n in zf.namelist()
            if n.startswith("remote_scripts/") and n.endswith(".py")
        }


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
        for name, source in sources.items() if PRECOMPILED else ():
            module = ".".join(["remote_scripts", *name[:-3].split("/")])
            module = module[: -len(".__init__")] if module.endswith(".__init__") else module
            code = compile(source, CODE_FILENAME.format(name), "exec", dont_inherit=True)
            add(f"{CODE_PREFIX}{module}", marshal.dumps(code, 2))
    return buf.getvalue()
