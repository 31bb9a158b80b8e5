"""The probe runs in a fork of the verify child when that shares what the import/callsites checks
already imported (vLLM was imported twice per deep verify, once more by the probe's fresh
interpreter). The fork must answer like `subprocess.run(capture_output=True, text=True,
timeout=...)`: stdin, stdout, stderr, exit status, TimeoutExpired; and keep the probe's side effects
out of the verify process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from remote_scripts.checks import probe_fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork-only")


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_forked_probe_shares_loaded_modules_reads_stdin_and_keeps_its_side_effects(tmp_path):
    # a module the "verify child" holds; the probe must find the very same object
    import json as shared

    shared.fleetops_marker = os.getpid()
    script = _script(
        tmp_path,
        """
        import json, os, sys
        req = json.loads(sys.stdin.read())
        shared = sys.modules["json"]
        print("log line", file=sys.stderr)
        print(json.dumps({"got": req, "marker": getattr(shared, "fleetops_marker", None),
                          "main": __name__, "path": sys.path, "pid": os.getpid()}))
        shared.fleetops_marker = "changed by the probe"
        sys.exit(3)
    """,
    )
    proc = probe_fork.run_forked(script, json_dumps({"a": 1}), timeout=60)
    try:
        answer = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
        assert proc.returncode == 3
        assert answer["got"] == {"a": 1}
        assert answer["marker"] == os.getpid()  # inherited, not re-imported
        assert answer["pid"] != os.getpid()
        assert answer["main"] == "__main__"
        # the script's directory is not put on sys.path: a temp directory is anyone's, and a module
        # planted there would be imported before the real one
        assert str(tmp_path) not in answer["path"], answer["path"]
        assert "log line" in proc.stderr
        # the probe's monkeypatching stayed in its process
        assert shared.fleetops_marker == os.getpid()
    finally:
        del shared.fleetops_marker


def json_dumps(obj: object) -> str:
    import json

    return json.dumps(obj)


def test_forked_probe_is_killed_at_its_timeout(tmp_path):
    script = _script(
        tmp_path,
        """
        import sys, time
        print("started", file=sys.stderr, flush=True)
        time.sleep(600)
    """,
    )
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        probe_fork.run_forked(script, "{}", timeout=1)
    assert time.monotonic() - started < 60
    assert "started" in (info.value.stderr or "")


def test_an_uncaught_exception_is_a_nonzero_exit_with_its_traceback(tmp_path):
    script = _script(tmp_path, "raise RuntimeError('probe broke')\n")
    proc = probe_fork.run_forked(script, "", timeout=60)
    assert proc.returncode == 1 and "RuntimeError: probe broke" in proc.stderr


def test_a_threaded_process_runs_the_probe_in_a_fresh_interpreter_through_the_bootstrap(tmp_path):
    """The agent itself has its watchdog thread (and nothing third-party): no fork there, a new
    interpreter started through the verifying bootstrap (role `probe`), the probe's source on an
    inherited descriptor."""
    from fleetops.wire.bundle import BOOTSTRAP, PYTHON_FLAGS, agent_bundle
    from remote_scripts.core.protocol import PROTOCOL

    b = agent_bundle()
    state = tmp_path / "state"
    (state / "bin").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "bin" / b.filename).write_bytes(b.data)
    (state / "bin" / b.filename).chmod(0o600)
    probe = (
        "import json, os, sys\nargv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "print(json.dumps({'ok': True, 'summary': '%d %s %s' "
        "% (os.getppid(), argv[-4].decode(), __name__)}))\n"
    )
    requests = [
        {"op": "ping"},
        {
            "op": "verify",
            "state_dir": str(state),
            "checks": [
                {"kind": "probe", "name": "p", "source": probe, "modules": [], "timeout": 60}
            ],
        },
    ]
    lines = "".join(
        json.dumps({"protocol": PROTOCOL, **r, "_id": i}) + "\n" for i, r in enumerate(requests, 1)
    )
    proc = subprocess.run(
        [
            sys.executable,
            *PYTHON_FLAGS,
            "-c",
            BOOTSTRAP,
            str(state),
            str(state / "bin" / b.filename),
            b.sha256,
        ],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ping, verify = (json.loads(line) for line in proc.stdout.splitlines())
    (item,) = [i for i in verify["items"] if i["kind"] == "probe"]
    ppid, role, name = item["msg"].split()
    # a new interpreter, the agent's child, started as the bootstrap's role `probe`, running the
    # probe as __main__
    assert item["ok"] and int(ppid) == ping["pid"] and role == "probe" and name == "__main__", item


def test_shares_imports_sees_a_third_party_package_in_a_single_threaded_process():
    code = (
        "import sys; sys.path.insert(0, %r); from remote_scripts.checks import probe_fork as p; "
        "a = p.shares_imports(); import pytest; print(a, p.shares_imports())" % os.getcwd()
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "True"]
