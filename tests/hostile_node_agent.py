"""A hostile node "agent" (the red team's script, reformatted, same behaviour): a host whose
`python` is a wrapper that execs this file (tests/hostile_hosts.py). The file `mode` beside it picks
the attack: `ansi` (terminal escapes in every string of every answer:
tests/test_terminal_safety_lab.py), `stderrflood`/`nonewline` (hundreds of MB, size from the file
`mb`), `nl` (error text whose line breaks would print other hosts' lines), `factsesc` (escapes and
line breaks in every facts field, the drain reason and pip-check names), `pipbomb` (a facts answer
whose Requires-Dist markers would cost the client seconds of CPU; size from `mb`), `deep` (nested
JSON), `wide` (millions of values in one answer), `rebase`/`capture` (node-chosen names with `../`
that become local paths), `types` (wrong types). Stdlib only; it runs on the node."""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))  # mode, mb: files beside this script


def _read(name: str) -> str:
    with open(os.path.join(HERE, name)) as f:
        return f.read()


mode = _read("mode").strip()
out = sys.stdout.buffer


def ans(d: dict) -> None:
    out.write((json.dumps(d) + "\n").encode())
    out.flush()


if mode == "nonewline":
    chunk = b"A" * (1 << 20)
    for _ in range(int(_read("mb"))):
        out.write(chunk)
    out.flush()
    time.sleep(30)
    sys.exit(0)
if mode == "stderrflood":
    chunk = b"B" * (1 << 20)
    for _ in range(int(_read("mb"))):
        sys.stderr.buffer.write(chunk)
    sys.stderr.flush()
    time.sleep(30)
    sys.exit(0)

# Whole lines that read as other hosts' results, and the same behind terminal escapes.
FORGE = (
    "\nlab02 | patch | changed | applied 2 hunks (original saved, sha256 0123456789ab)\r\n"
    "lab03 | verify | ok | 21/21 checks passed"
)
EVIL_NL = "\x1b]0;pwned\x1b\\\x1b[1A\x1b[2K" + FORGE

GENERATOR_FILES = (
    "a388f645ffeaa395-vllm_hidden_states_generator.py.orig",
    "speculators/data_generation/vllm_hidden_states_generator.py",
)
WORKER_FILES = (
    "309956783d44b712-custom_worker.py.orig",
    "speculators/data_generation/custom_worker.py",
)

for line in sys.stdin.buffer:
    req = json.loads(line)
    rid = req.get("_id")
    op = req.get("op")
    if mode == "wide":  # every op's answer: millions of values, under the 32 MiB line cap
        out.write(b'{"_id": %d, "ok": true, "x": [' % rid + b"0," * 15_000_000 + b"0]}\n")
        out.flush()
        continue
    if mode == "deep":
        out.write(b'{"_id": %d, "ok": true, "x": ' % rid + b"[" * 200000 + b"]" * 200000 + b"}\n")
        out.flush()
        continue
    if mode == "nl":
        if op == "run":
            ans(
                {
                    "_id": rid,
                    "ok": True,
                    "exit_code": 0,
                    "timed_out": False,
                    "timeout": 300,
                    "stdout": "hello" + FORGE,
                    "stderr": "",
                    "stdout_dropped_bytes": 0,
                    "stderr_dropped_bytes": 0,
                    "run_seconds": 0.1,
                }
            )
        else:
            ans({"_id": rid, "ok": False, "error": "boom" + FORGE, "error_kind": "x"})
        continue
    if mode == "factsesc" and op == "facts":
        s = "v1" + EVIL_NL
        dists = {
            "environment": {"python_version": "3.11"},
            "dists": [
                {
                    "name": "evilpkg" + EVIL_NL,
                    "version": "1.0",
                    "requires": ["needed\x1bx", "missing-dist-yyy"],
                },
                {"name": "good", "version": "1.0", "requires": ["missing-dist-zzz"]},
            ],
        }
        ans(
            {
                "_id": rid,
                "ok": True,
                "os": s,
                "python": s,
                "packages": {"vllm": s, "speculators": s, "torch": s, "transformers": s},
                "driver": s,
                "cuda": s,
                "gpu_count": 2,
                "gpu_names": [s],
                "disk_free_gib": {"venv": s, "state_dir": s},
                "errors": {},
                "drain": {"by": "x" + EVIL_NL, "at": "y", "reason": "z" + EVIL_NL},
                "dists": dists,
            }
        )
        continue
    if mode == "pipbomb" and op == "facts":
        # ~2.5 MB, one requirement
        one = "dep; python_version > '1'" + " and python_version > '1'" * 100000
        count = max(1, int(float(_read("mb")) * (1 << 20) / len(one)))
        dists = {
            "environment": {"python_version": "3.11"},
            "dists": [{"name": "dep", "version": "1"}]
            + [
                {"name": f"p{i}", "version": "1", "requires": [one + " " * i]} for i in range(count)
            ],
        }
        ans(
            {
                "_id": rid,
                "ok": True,
                "os": "x",
                "python": "3.11",
                "packages": {},
                "errors": {},
                "dists": dists,
            }
        )
        continue
    # OSC title and clipboard, erase, a forged line, C1 CSI (U+009B), a bidi override
    if mode == "ansi":
        E = "\x1b"
        evil = (
            f"{E}]0;pwned-title{E}\\{E}[2J{E}[H{E}]52;c;cm0gLXJmIH4K{E}\\lab02 "
            f"| patch | ok | forged{E}[31m"
            "\x9b2K\u202eevil"
        )
        if op == "run":
            ans(
                {
                    "_id": rid,
                    "ok": True,
                    "exit_code": 0,
                    "timed_out": False,
                    "timeout": 300,
                    "stdout": evil,
                    "stderr": evil,
                    "stdout_dropped_bytes": 0,
                    "stderr_dropped_bytes": 0,
                    "run_seconds": 0.1,
                }
            )
        else:
            ans({"_id": rid, "ok": False, "error": evil, "error_kind": evil})
        sys.stderr.write(evil + "\n")
        sys.stderr.flush()
        continue

    if mode == "rebase":
        base = os.environ["LAB01_BACKUPS"] + "/"
        files = {
            "speculators.data_generation.vllm_hidden_states_generator": GENERATOR_FILES,
            "speculators.data_generation.custom_worker": WORKER_FILES,
        }
        items = []
        for m in req.get("modules", []):
            f, rel = files[m]
            with open(base + f) as fh:
                t = fh.read()
            items.append(
                {
                    "module": m,
                    "ok": True,
                    "file": "/x/" + rel,
                    "rel": rel,
                    "pristine": t,
                    "current": t,
                    "changed": False,
                    "pristine_source": "x",
                }
            )
        ans(
            {
                "_id": rid,
                "ok": True,
                "items": items,
                "versions": {"speculators": "../../../../../outside/PWNED-rebase", "vllm": None},
            }
        )
        continue

    if mode == "capture":
        items = []
        for m in [
            "../../../../../../../outside/CAPTURED",
            "y/../../../../../../../outside/CAPTURED",
        ]:
            items.append(
                {
                    "module": m,
                    "ok": True,
                    "file": "/x",
                    "rel": "x.py",
                    "pristine": "a = 1\n",
                    "current": "a = 1\nimport os; os.system('id')  # planted by the node\n",
                    "changed": True,
                    "pristine_source": "x",
                    "dist": "speculators",
                }
            )
        ans({"_id": rid, "ok": True, "items": items, "versions": {"speculators": "0.3.0"}})
        continue
    if mode == "types":
        ans({"_id": rid, "ok": True, "items": "notalist", "exit_code": "x"})
        continue
    ans({"_id": rid, "ok": True})
