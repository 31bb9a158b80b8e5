"""The verifying bootstrap: how every fleetops process on a node starts, trusting nothing it finds
there.

The client runs this file's text as `python -I -S -c <this text> <state_dir>
<state_dir>/bin/<name>.pyz <sha256> [--allow-insecure-venv] [role words...]`: argv words, never
shell built from data. The agent starts its own long-running processes (job keeper `wrap`,
`extract`, the Slurm batch step, verify's probe) the same way, with the text and sha256 it was
itself started with (launch.relaunch), so no process of fleetops ever runs a zip by its path
(`python <path>.pyz` would run whatever the path names when Python opens it).

1. The state dir's whole path as written (walk()): every component is opened with O_NOFOLLOW
   relative to the directory before it and checked like OpenSSH's StrictModes (owned by the
   connecting user or root, writable by no one else; a directory on the way may instead be sticky);
   a symlink on the way is followed only where no other user can replace it (its directory is
   trusted, and in a sticky directory the link is ours or root's); the state dir, bin/ and the zip
   themselves are never symlinks.
2. The zip's bytes are read ONCE from the descriptor that walk opened, their sha256 checked against
   the client's, and the agent is imported from those very bytes (no verify-then-reopen window, no
   unpacked copy). The sha256 is remembered beside the zip (<zip>.verdict, ours, 0600) with the
   file's identity (device, inode, size, mtime, ctime, mode, owner) as it was read: a later start
   whose read of the zip ends with that very identity takes the sha256 from it instead of hashing
   562 KB with OpenSSL (~2.5 ms of each start with its import). Any write to the zip sets its ctime,
   which no user can set back, and a verdict is kept only for a zip unchanged for 2 s (a change in
   the same clock tick would keep its ctime), so what the verdict names is what the zip holds;
   only its owner (or root) can write the verdict, as they can the zip.
3. The interpreter (launch.Interpreter, from those bytes): its executable, prefixes, every directory
   on sys.path and the site-packages directories with their .pth files, checked the same way. `-S`
   keeps `site` from running at start-up, because a .pth file runs code when `site` reads its
   directory: `site.main()` runs only after this check passed, and the directories it added (.pth
   lines) are checked in turn. `-I` (isolated: -E -s -P) drops PYTHONPATH and the other PYTHON*
   variables of the login environment, the user site directory and the current directory from
   sys.path; the venv's own site-packages is still added by site.main(), so -I suffices (no `-E
   -s`). `--allow-insecure-venv` turns an interpreter refusal into a warning.

With become (the client runs this through sudo), a leading `--ready` makes the very first stdout
line {"ready": true} (the client sends sudo's password only while sudo is still asking, and its
requests only once this line says the interpreter runs). A missing agent is then not the end: the
refusal line says "send_agent": true, and the zip comes on this same stdin (receive(): the line
`fleetops-agent SIZE`, then SIZE bytes), written into the state dir, root's own, only if its bytes
have the client's sha256 (install()), then run: root never runs a file the login user could have
written, and sudo runs once per host and run, so its password (--ask-become-pass) is sent once.

A refusal is one JSON line {"bootstrap": true, "error_kind": ..., "error": ...} and exit 3:
agent_missing (the client uploads it), untrusted_state, untrusted_venv, agent_mismatch or
python_too_old (older than OLDEST_PYTHON, whose syntax the agent's modules use: refused before any
of them is read; the client reports it).

Stdlib only, and small: a node whose Python is not the client's compiles this text at every agent
start (the client's launcher, fleetops/wire/bundle.py, hands the others its compiled form); what can
wait for the verified, precompiled bytes lives in launch.py.
"""

import gc
import marshal
import os
import stat
import sys
import zlib

EXIT_REFUSED = 3
# the agent's code needs it (built-in generics, str.removesuffix); README: node Pythons
OLDEST_PYTHON = (3, 9)
ALLOW_INSECURE_VENV = "--allow-insecure-venv"
READY = "--ready"
AGENT_FRAME = b"fleetops-agent "  # then the zip's size and a newline, then the zip (receive())
MAX_AGENT_BYTES = 64 << 20
PYTHON_FLAGS = ("-I", "-S")  # see the module docstring: isolated, and `site` only after the checks
MAX_LINKS = 40  # as the kernel's own limit on symlinks in one path resolution
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
SHARED_FIX = (
    "it is a directory every user shares: never chmod it; use a private directory instead (for "
    "the state dir: `state_dir:` in the inventory, e.g. ~/.fleetops, or a 0700 directory of your "
    "own inside this one)"
)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# importlib.machinery.ModuleSpec, the class of every module's __spec__: importing
# importlib.machinery (with importlib and warnings) costs ~0.6 ms of each start, and nothing else of
# the agent's start needs it
ModuleSpec = type(sys.__spec__)


class Refused(Exception):
    def __init__(self, kind, msg, reason="", **extra):
        Exception.__init__(self, msg)
        self.kind, self.reason, self.extra = kind, reason or msg, extra


def refuse(kind, msg, **extra):
    import json

    sys.stdout.write(
        json.dumps(dict(ok=False, bootstrap=True, error_kind=kind, error=msg, **extra)) + "\n"
    )
    sys.stdout.flush()
    sys.exit(EXIT_REFUSED)


def untrusted(path, why, st, fix, kind="untrusted_state", what="the agent"):
    mode = "%04o" % (st.st_mode & 0o7777)
    reason = "%s %s [mode %s (%s), owner uid %d]" % (
        path,
        why,
        stat.filemode(st.st_mode),
        mode,
        st.st_uid,
    )
    raise Refused(
        kind,
        "refusing to run %s: %s; %s" % (what, reason, fix),
        reason,
        path=path,
        mode=mode,
        uid=st.st_uid,
    )


# ---------------------------------------------------------------- paths, as written
class Rules:
    """What a walk checks, and how a refusal reads: `role` names the path for the operator ("the
    state dir"), `fix` the next step for a path others may write ("{path}" in it: the path
    refused)."""

    def __init__(self, role, kind="untrusted_state", fix="", what="the agent"):
        self.role, self.kind, self.fix, self.what = role, kind, fix, what

    def refuse(self, path, why, st, fix):
        untrusted(path, why, st, fix, self.kind, self.what)

    def owner(self, path, st, on_way):
        uid = os.geteuid()
        if st.st_uid not in (uid, 0):
            self.refuse(
                path,
                "%sis owned by uid %d, not by the connecting user (uid %d) or root"
                % (on_way, st.st_uid, uid),
                st,
                "check who changed it, then chown %d %s (or remove it) and run again" % (uid, path),
            )

    def writable(self, path, why, st):
        fix = self.fix or "check who changed it, then chmod go-w {path} and run again"
        # /tmp: a chmod breaks it for all
        if path.rstrip("/") in SHARED_DIRS or st.st_mode & 0o1002 == 0o1002:
            fix = SHARED_FIX
        self.refuse(path, why, st, fix.replace("{path}", path))

    def directory(self, path, st, last):
        """A directory: ours or root's, writable by no one else; one on the way may instead be
        sticky."""
        on_way = "" if last else "(on the way to %s) " % self.role
        self.owner(path, st, on_way)
        if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
            self.writable(
                path,
                "%sis writable by group or others%s" % (on_way, "" if last else " and not sticky"),
                st,
            )

    def file(self, path, st):
        self.owner(path, st, "")
        if st.st_mode & 0o022:
            self.writable(path, "is writable by group or others", st)
        if not stat.S_ISREG(st.st_mode):
            self.refuse(
                path,
                "is not a regular file",
                st,
                "move it aside (mv %s %s.moved) and run again" % (path, path),
            )


def walk(path, rules, final_dir=True, final_link=False, seen=None):
    """Open `path` as written, one component at a time, each relative to the directory before it and
    never through a symlink it did not check: every directory on the way is trusted
    (rules.directory, sticky allowed), a symlink on the way only where no other user can replace it
    (its directory is trusted; in a directory others may write, the link must be ours or root's),
    then followed from there. The last component is checked strictly (not sticky), and is a symlink
    only with final_link. Returns an open descriptor of it (the caller closes it), or None when a
    component does not exist. Raises Refused.

    `seen` (walked path -> descriptor of a directory, or target of a symlink, that passed on the
    way) lets walks of paths that share directories check them once; its owner closes them
    (forget)."""
    own = seen is None
    seen = {} if own else seen
    try:
        return _walk(path, rules, final_dir, final_link, seen)
    finally:
        if own:
            forget(seen)


def forget(seen):
    for value in seen.values():
        if isinstance(value, int):
            os.close(value)
    seen.clear()


def _walk(path, rules, final_dir, final_link, seen):
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    # the names left, the next one last
    todo = [n for n in path.split("/")[::-1] if n not in ("", ".")]
    if "/" not in seen:
        seen["/"] = os.open("/", _DIR)
    rules.directory("/", os.fstat(seen["/"]), not todo)
    stack = ["/"]  # the directories entered, as walked
    links = 0
    while todo:
        name, here = todo.pop(), stack[-1]
        if name == "..":
            if len(stack) > 1:
                stack.pop()
            continue
        shown, last = here.rstrip("/") + "/" + name, not todo
        known = seen.get(shown)
        if known is None:
            fd = seen[here]
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if last and not final_dir and not stat.S_ISLNK(st.st_mode):
                return _open_checked(name, fd, shown, st, rules, _FILE, rules.file)
            known = seen[shown] = _step(name, fd, shown, st, last, rules)
        # passed on the way to another path: now the last, strictly
        elif last and isinstance(known, int):
            rules.directory(shown, os.fstat(known), True)
        if isinstance(known, str):  # a symlink
            links += 1
            _may_follow(name, seen[here], shown, known, last and not final_link, links, rules)
            if known.startswith("/"):
                stack = ["/"]
            todo.extend(n for n in known.split("/")[::-1] if n not in ("", "."))
            continue
        stack.append(shown)
    return os.dup(seen[stack[-1]])


def _step(name, fd, shown, st, last, rules):
    """One component on the way, not yet seen: a symlink's target (str) or the directory's
    descriptor."""
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=fd)
        if os.fstat(fd).st_mode & 0o022 and st.st_uid not in (os.geteuid(), 0):
            rules.refuse(
                shown,
                "(a symlink on the way to %s) sits in a directory others may write and is "
                "owned by uid %d, who may point it anywhere" % (rules.role, st.st_uid),
                st,
                "give the path without it (its target is %s)" % target,
            )
        return target
    if not stat.S_ISDIR(st.st_mode):
        rules.refuse(
            shown,
            "is not a directory",
            st,
            "move it aside (mv %s %s.moved) and run again" % (shown, shown),
        )
    return _open_checked(
        name, fd, shown, st, rules, _DIR, lambda path, fst: rules.directory(path, fst, last)
    )


def _open_checked(name, fd, shown, st, rules, flags, check):
    """Open (O_NOFOLLOW: never a link put there meanwhile) and check what was opened, not the
    name."""
    try:
        nfd = os.open(name, flags, dir_fd=fd)
    except OSError:
        rules.refuse(shown, "changed while fleetops checked it", st, "run again")
    try:
        check(shown, os.fstat(nfd))
    except BaseException:
        os.close(nfd)
        raise
    return nfd


def _may_follow(name, fd, shown, target, refuse_link, links, rules):
    """A symlink is followed unless it is the last component and links are refused, or one too
    many."""
    if refuse_link:
        rules.refuse(
            shown,
            "is a symlink (to %s); fleetops never follows symlinks in its state dir" % target,
            os.stat(name, dir_fd=fd, follow_symlinks=False),
            "remove it (rm %s) and run again" % shown,
        )
    if links > MAX_LINKS:
        rules.refuse(
            shown,
            "is one symlink too many (more than %d on the way)" % MAX_LINKS,
            os.stat(name, dir_fd=fd, follow_symlinks=False),
            "give the path without symlink loops",
        )


# ---------------------------------------------------------------- the agent's bytes
def read_agent(state_dir, pyz, want, seen=None):
    """The zip's bytes, read once through the descriptor the walk opened (state dir, bin/ and the
    zip checked on the way), and checked against the sha256 the client expects."""
    if os.path.dirname(pyz) != os.path.join(state_dir.rstrip("/") or "/", "bin"):
        raise Refused(
            "untrusted_state", "refusing to run the agent: %s is not in %s/bin" % (pyz, state_dir)
        )
    fd = walk(state_dir, Rules(state_dir), seen=seen)
    if fd is None:
        raise Refused("agent_missing", "%s does not exist yet" % state_dir)
    try:
        bin_fd = _open_in(fd, "bin", os.path.join(state_dir, "bin"), True)
    finally:
        os.close(fd)
    name, keep = os.path.basename(pyz), None
    try:
        file_fd = _open_in(bin_fd, name, pyz, False)
        with os.fdopen(file_fd, "rb") as f:
            data = f.read()
            # after the read: any write to the zip before it ended shows in its ctime
            read = os.fstat(f.fileno())
        # mode, inode, device, links, owner, group, size (os.stat_result's first fields), times
        line = "fleetops-verdict-1 %%s %r %d %d\n" % (read[:7], read.st_mtime_ns, read.st_ctime_ns)
        got = _verdict(bin_fd, name, line)
        if got != want:  # (a verdict names the whole sha256: never a prefix the client sent)
            from hashlib import sha256  # OpenSSL's, ~2 ms to load: only when there is no verdict

            got = sha256(data).hexdigest()
            keep = (bin_fd, name + VERDICT, line % got)
    finally:
        if keep is None:
            os.close(bin_fd)
    # refused: the process exits, bin/'s descriptor (kept for the verdict) with it
    if not want or (got != want and not (len(want) < 64 and got.startswith(want))):
        raise Refused(
            "agent_mismatch",
            "%s is not the agent fleetops sent (sha256 %s, expected %s): something on the node "
            "changed it; refusing to run it. Check who did, remove it (rm %s) and run again: "
            "fleetops uploads a fresh copy" % (pyz, got, want, pyz),
            path=pyz,
            sha256=got,
            expected=want,
        )
    return data, got, keep


VERDICT = ".verdict"  # <zip>.verdict: "fleetops-verdict-1 SHA256 IDENTITY\n", ours, 0600


def _verdict(bin_fd, name, line):
    """The sha256 the zip's verdict (launch.keep_verdict) names, if it is a regular file of ours
    writable by no one else and names the zip's identity as read (`line`, the sha256 left as %s)."""
    try:
        fd = os.open(name + VERDICT, _FILE, dir_fd=bin_fd)
        try:
            vst = os.fstat(fd)
            text = os.read(fd, 512).decode("latin-1")
        finally:
            os.close(fd)
    except OSError:
        return None
    if stat.S_ISREG(vst.st_mode) and vst.st_uid == os.geteuid() and not vst.st_mode & 0o022:
        if text == line % text[19:83]:
            return text[19:83]


def _open_in(dir_fd, name, path, is_dir):
    """`name` in the directory `dir_fd`: never a symlink, ours or root's, writable by no one
    else."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise Refused("agent_missing", "%s does not exist yet" % path) from None
    rules = Rules(path)
    if stat.S_ISLNK(st.st_mode):
        untrusted(
            path,
            "is a symlink (to %s); fleetops never follows symlinks in its state dir"
            % os.readlink(name, dir_fd=dir_fd),
            st,
            "remove it (rm %s) and run again" % path,
        )
    if stat.S_ISDIR(st.st_mode) != is_dir:
        untrusted(
            path,
            "is not a %s" % ("directory" if is_dir else "regular file"),
            st,
            "move it aside (mv %s %s.moved) and run again" % (path, path),
        )
    fd = os.open(name, _DIR if is_dir else _FILE, dir_fd=dir_fd)
    try:
        nst = os.fstat(fd)
        if (nst.st_ino, nst.st_dev) != (st.st_ino, st.st_dev):
            untrusted(path, "changed while fleetops checked it", nst, "run again")
        if is_dir:
            rules.directory(path, nst, True)
        else:
            rules.file(path, nst)
    except BaseException:
        os.close(fd)
        raise
    return fd


def members(data):
    # The zip's members, read from its central directory: the bytes are already verified, and
    # agent_bundle writes only stored or deflated members, no zip64. (zipfile's import alone cost
    # ~10 ms per start; its little-endian fields are read with int.from_bytes, without struct's
    # import.) Each entry's header is sliced once, and its bytes are a view of the zip, not a copy.
    num = int.from_bytes
    view = memoryview(data)
    end = data.rfind(b"PK\x05\x06")
    count, pos = num(data[end + 10 : end + 12], "little"), num(data[end + 16 : end + 20], "little")
    for _ in range(count):
        head = data[pos : pos + 46]
        method, size = num(head[10:12], "little"), num(head[20:24], "little")
        nlen, xlen, clen = (
            num(head[28:30], "little"),
            num(head[30:32], "little"),
            num(head[32:34], "little"),
        )
        local = num(head[42:46], "little")
        name = data[pos + 46 : pos + 46 + nlen].decode("utf-8")
        pos += 46 + nlen + xlen + clen
        lens = data[local + 26 : local + 30]
        start = local + 30 + num(lens[0:2], "little") + num(lens[2:4], "little")
        yield name, (method, view[start : start + size])


def inflate(member):
    # Only the members an op imports are inflated (a verify imports a third of them): the bytes were
    # verified as a whole already.
    method, raw = member
    return zlib.decompress(raw, -15) if method == 8 else bytes(raw)


def code_prefix(names):
    """Where the zip keeps the modules compiled for this interpreter ("code-<magic>/"), None when it
    has none. Started by the client's launcher as the very Python the client is
    (FLEETOPS_SAME_PYTHON), the zip's only compiled set is ours: importlib.util (~3 ms of each
    start) is imported only to compare magic numbers."""
    if globals().get("FLEETOPS_SAME_PYTHON"):
        return next(
            (
                name[: name.index("/") + 1]
                for name in names
                if name.startswith("code-") and "/" in name
            ),
            None,
        )
    from importlib.util import MAGIC_NUMBER

    return "code-%s/" % MAGIC_NUMBER.hex()


class Agent:
    """The import finder and loader of the agent's modules, from the verified bytes. It also
    remembers how this process was started (relaunch() starts others the same way) and the
    interpreter warnings."""

    def __init__(self, data, pyz, state_dir, digest, flags, warnings):
        self.files, self.codes = {}, {}
        self.pyz, self.state_dir, self.sha256, self.flags, self.warnings = (
            pyz,
            state_dir,
            digest,
            flags,
            warnings,
        )
        self.python_flags = PYTHON_FLAGS  # relaunch() starts the agent's other processes with these
        entries = list(members(data))
        compiled = code_prefix([name for name, _ in entries])
        for name, source in entries:
            if name.startswith("remote_scripts/") and name.endswith(".py"):
                mod, pkg = name[:-3].replace("/", "."), name.endswith("/__init__.py")
                self.files[mod[:-9] if pkg else mod] = (source, "%s/%s" % (pyz, name), pkg)
            # compiled by a client of this very Python: no compile here
            elif compiled and name.startswith(compiled):
                self.codes[name[len(compiled) :]] = source

    def find_spec(self, name, path=None, target=None):
        if name not in self.files:
            return None
        spec = ModuleSpec(name, self, origin=self.files[name][1], is_package=self.files[name][2])
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__spec__.name
        source, origin, _ = self.files[name]
        code = self.codes.get(name)
        exec(
            marshal.loads(inflate(code))
            if code is not None
            else compile(inflate(source), origin, "exec", dont_inherit=True),
            module.__dict__,
        )

    def get_source(self, name):
        return inflate(self.files[name][0]).decode("utf-8")


def receive(state_dir, pyz, want, why):
    """become: the agent is missing; ask for it on stdin, past the request lines sent before this
    answer (the client sends them again after the zip; they stay in sys.stdin.buffer, which the
    agent reads on), and install it. The client's requests are JSON lines, so no request line starts
    with AGENT_FRAME."""
    import json

    sys.stdout.write(
        json.dumps(
            dict(ok=False, bootstrap=True, error_kind="agent_missing", error=why, send_agent=True)
        )
        + "\n"
    )
    sys.stdout.flush()
    stdin, skipped = sys.stdin.buffer, 0
    while True:
        line = stdin.readline(MAX_AGENT_BYTES)
        if not line:  # the client went away instead
            sys.exit(EXIT_REFUSED)
        if line.startswith(AGENT_FRAME):
            break
        skipped += len(line)
        if skipped > MAX_AGENT_BYTES:
            raise Refused(
                "agent_mismatch",
                "refusing to install the agent: no agent came on stdin after %d bytes" % skipped,
            )
    size = line[len(AGENT_FRAME) :].strip()
    if not size.isdigit() or int(size) > MAX_AGENT_BYTES:
        raise Refused(
            "agent_mismatch", "refusing to install the agent: its size line was %r" % line[:80]
        )
    try:
        install(state_dir, pyz, want, stdin.read(int(size)))
    except OSError as exc:
        raise Refused(
            "untrusted_state", "cannot install the agent in %s: %s" % (state_dir, exc)
        ) from None


def install(state_dir, pyz, want, data):
    """The zip's bytes into STATE_DIR/bin (both made 0700 if missing), written under a temp name and
    renamed, only if they have the sha256 `want`; the state dir's path is walked as for a run
    first."""
    from hashlib import sha256

    got = sha256(data).hexdigest()
    if got != want or os.path.dirname(pyz) != os.path.join(state_dir.rstrip("/") or "/", "bin"):
        raise Refused(
            "agent_mismatch",
            "refusing to install the agent: the bytes received have sha256 %s, "
            "expected %s (for %s); run again" % (got, want, pyz),
        )
    parent = os.path.dirname(state_dir.rstrip("/")) or "/"
    fd = walk(parent, Rules(state_dir))
    if fd is None:
        raise Refused(
            "untrusted_state", "refusing to install the agent: %s does not exist" % parent
        )
    os.close(fd)
    for path in (state_dir, os.path.dirname(pyz)):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    fd = walk(os.path.dirname(pyz), Rules(state_dir))
    try:
        tmp = "%s.%d.tmp" % (os.path.basename(pyz), os.getpid())
        out = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=fd,
        )
        with os.fdopen(out, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.basename(pyz), src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def main(argv):
    # No cyclic garbage collection while the agent starts: its imports make ~10,000 objects the
    # collector tracks and free few, so the collections they set off (~0.5-1 ms of each start) find
    # nothing. agent.main turns it on again before any request or role runs.
    gc.disable()
    becoming = argv[:1] == [READY]
    if becoming:  # through sudo: the interpreter runs, sudo asks for nothing more
        argv = argv[1:]
        sys.stdout.write('{"ready": true}\n')
        sys.stdout.flush()
    # before any module of the agent is read: they would not load
    if sys.version_info[:2] < OLDEST_PYTHON:
        version = sys.version.split()[0]
        refuse(
            "python_too_old",
            "refusing to run the agent with Python %s (%s): the fleetops agent needs Python "
            "%d.%d or newer. Point this host's `python:` in the inventory at an interpreter of "
            "Python %d.%d or newer (the venv whose packages fleetops patches and checks)"
            % ((version, sys.executable) + OLDEST_PYTHON + OLDEST_PYTHON),
            python=version,
            python_path=sys.executable,
        )
    if len(argv) < 3:
        refuse(
            "bad_request",
            "usage: python -I -S -c BOOTSTRAP STATE_DIR PYZ SHA256 [%s] [ROLE ...]"
            % ALLOW_INSECURE_VENV,
        )
    state_dir, pyz, want = argv[:3]
    rest = list(argv[3:])
    flags = []
    if rest and rest[0] == ALLOW_INSECURE_VENV:
        flags.append(rest.pop(0))
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    dirs = {}  # the directories the walks below passed, checked once
    try:
        try:
            data, got, keep = read_agent(state_dir, pyz, want, dirs)
        except Refused as exc:
            if exc.kind != "agent_missing" or not becoming:
                raise
            forget(dirs)
            receive(state_dir, pyz, want, str(exc))
            data, got, keep = read_agent(state_dir, pyz, want, dirs)
    except Refused as exc:
        refuse(exc.kind, str(exc), **exc.extra)
    except OSError as exc:
        refuse(
            "untrusted_state",
            "cannot check the state dir %s: %s; check its permissions" % (state_dir, exc),
        )
    # absolute: the processes it starts run elsewhere (a job's dir; sbatch --chdir), the default
    # state dir is not
    agent = Agent(data, os.path.abspath(pyz), os.path.abspath(state_dir), got, flags, [])
    sys.meta_path.insert(0, agent)
    os.environ["FLEETOPS_AGENT_SHA256"] = got
    from remote_scripts.core import launch  # verified code, compiled by the client: no compile here
    from remote_scripts.core.launch import Interpreter

    # the node's writer walks where it writes as this walked the state dir
    launch.PATHS = (walk, Rules)
    if keep:
        launch.keep_verdict(*keep)  # the agent's bytes: remembered for the next start
    interpreter = Interpreter(bool(flags), dirs, walk, Rules, Refused)
    try:
        interpreter.before_site()
        # started as the client starts it: now that the .pth files were checked
        if sys.flags.no_site:
            import site

            site.main()
            interpreter.after_site()
    except Refused as exc:
        refuse(exc.kind, str(exc), **exc.extra)
    except OSError as exc:
        refuse(
            "untrusted_venv",
            "cannot check the interpreter %s: %s; check its permissions" % (sys.executable, exc),
        )
    forget(dirs)
    for line in interpreter.warnings:
        sys.stderr.write("fleetops: warning: %s\n" % line)
    agent.warnings = interpreter.warnings
    sys.argv[:] = [pyz, *rest]
    from remote_scripts import ops

    if rest:  # a long-running role (wrap, extract, ...): vLLM's exit handlers run, so a normal exit
        sys.exit(ops.main())
    ops.serve_and_exit()


if __name__ == "__main__":
    main(sys.argv[1:])
