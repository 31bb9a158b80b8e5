"""The node CPU of one agent start, and of the requests a steady-state run sends, for one or more
versions of remote_scripts/ side by side.

    python bench/agent_cpu.py [--runs 60] [--python 3.12] [LABEL=DIR ...] [--rev LABEL=GITREV ...]

Each DIR is a copy of remote_scripts/ (e.g. `git archive REV remote_scripts | tar -x -C ~/rev`, then
LABEL=~/rev/remote_scripts); without any, the checkout's own. Each version is built into its agent
zip the way the client builds it (fleetops.wire.bundle) and started with its own bootstrap as the
client starts it (`python -I -S -c LAUNCHER ... STATE_DIR PYZ SHA256`: the bootstrap compiled by
this Python, or its text). A --rev is a whole commit of this repository (git archive into a
temporary folder): its own client builds its zip, bootstrap (and launcher, where it has one),
interpreter flags, protocol number and requests, so versions from before the agent's layout or
protocol changed compare too. All run under a lab node's interpreter (a one-node lab made in a
temporary directory: its venv over the lab base venv, real speculators 0.3.0 and vLLM 0.16.0; with
--python, a node of that Python instead, without vLLM, the playbook's requirement narrowed to
speculators). No SSH: what is measured is the agent process alone, user + system CPU
(resource.getrusage of the waited children), the versions interleaved run by run so that the
machine's load falls on all of them alike. Scenarios:

- start: the agent starts, answers `ping`, and exits (the session's end);
- verify: `ping`, then the shipped playbook's `verify --kinds grep,compile` on a patched node, its
  kept code lines and compile warm (what a steady-state `patch verify` costs beyond the patch);
- patch+verify: `patch` (already applied) and the same verify;
- run: what `fleet patch verify --kinds grep,compile` with the shipped playbook set sends: the
  installed versions the set chooses a playbook by (`facts`, packages only), then that patch and
  verify.

Prints, per scenario and version, the median and the mean of the lowest quartile, in ms; and the
same for `python -I -S -c pass` (the interpreter's own start, which no agent can go below).
"""

from __future__ import annotations

import argparse
import base64
import json
import marshal
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetops.lab import Lab  # noqa: E402
from fleetops.plans.playbook import load_playbook  # noqa: E402
from fleetops.wire import bundle  # noqa: E402
from fleetops.wire.bundle import PYTHON_FLAGS  # noqa: E402
from remote_scripts.core.protocol import PROTOCOL  # noqa: E402

PLAYBOOK = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16.yaml"
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


# Run by a commit's own client (its tree first on sys.path): what its fleetops sends a node, as
# JSON.
REV_DUMP = r"""
import base64, json, os
from pathlib import Path
from fleetops.wire import bundle
from fleetops.plans.playbook import load_playbook
if os.path.exists("remote_scripts/core/protocol.py"):
    from remote_scripts.core.protocol import PROTOCOL
else:
    from remote_scripts.protocol import PROTOCOL
book = load_playbook(Path("playbooks/speculators-0.3.0-vllm-0.16.yaml"))
made = bundle.agent_bundle()
if hasattr(bundle, "launch_words"):
    launch = list(bundle.launch_words())
else:
    launch = ["-c", bundle.BOOTSTRAP]
print(json.dumps({"data": base64.b64encode(made.data).decode(), "launch": launch,
                  "flags": list(getattr(bundle, "PYTHON_FLAGS", [])), "protocol": PROTOCOL,
                  "patch": book.patch_request(),
                  "verify": book.verify_request({"grep", "compile"})}))
"""


class Version:
    flags: tuple[str, ...] = PYTHON_FLAGS
    protocol: int = PROTOCOL
    requests: dict | None = None  # a --rev's own patch and verify requests

    def __init__(self, label: str, root: Path, state: Path) -> None:
        sources = {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*.py"))
            if p.name != "__main__.py" and "__pycache__" not in p.parts
        }
        self.label, self.data = label, bundle._build(sources)
        bootstrap = (root / "core" / "bootstrap.py").read_text()
        # this checkout's launcher, with that copy's bootstrap text (compiled by this Python, as the
        # client does)
        dash_c, launcher, tag, code, source = bundle.launch_words()
        packed = base64.b64encode(
            zlib.compress(
                marshal.dumps(
                    compile(
                        bootstrap, "<fleetops bootstrap>", "exec", dont_inherit=True, optimize=2
                    )
                ),
                9,
            )
        ).decode()
        self.launch = (
            dash_c,
            launcher,
            tag,
            packed,
            base64.b64encode(zlib.compress(bootstrap.encode(), 9)).decode(),
        )
        self._place(state)

    @classmethod
    def of_rev(cls, label: str, rev: str, top: Path, state: Path) -> Version:
        tree = top / f"rev-{label}"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        made = json.loads(
            subprocess.run(
                [sys.executable, "-c", REV_DUMP],
                cwd=tree,
                capture_output=True,
                text=True,
                env={**ENV, "PYTHONPATH": str(tree)},
                check=True,
            ).stdout
        )
        version = cls.__new__(cls)
        version.label, version.data, version.launch = (
            label,
            base64.b64decode(made["data"]),
            tuple(made["launch"]),
        )
        version.flags, version.protocol = tuple(made["flags"]), made["protocol"]
        version.requests = {
            "patch": {"op": "patch", **made["patch"]},
            "verify": {"op": "verify", **made["verify"]},
        }
        version._place(state)
        return version

    def _place(self, state: Path) -> None:
        import hashlib

        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.state = state
        (state / "bin").mkdir(parents=True, mode=0o700)
        state.chmod(0o700)
        self.pyz = state / "bin" / f"fleetops-agent-{self.sha256[:20]}.pyz"
        self.pyz.write_bytes(self.data)
        self.pyz.chmod(0o600)

    def run(self, python: Path, requests: list[dict]) -> tuple[float, list[dict]]:
        if self.requests is not None:  # a commit's own requests, in the same scenario
            requests = [self.requests.get(r["op"], r) for r in requests]
        lines = "".join(
            json.dumps(
                {
                    "protocol": self.protocol,
                    "state_dir": str(self.state),
                    "operator": "bench@lab",
                    **r,
                    "_id": i,
                }
            )
            + "\n"
            for i, r in enumerate(requests, 1)
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(
            [str(python), *self.flags, *self.launch, str(self.state), str(self.pyz), self.sha256],
            input=lines,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(
                f"{self.label}: the agent exited {proc.returncode}: {proc.stderr[-2000:]}"
            )
        answers = [json.loads(x) for x in proc.stdout.splitlines()]
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return cpu * 1000, answers


def _bare(python: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([str(python), "-I", "-S", "-c", "pass"], check=True, env=ENV)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000


def _summary(values: list[float]) -> str:
    low = sorted(values)[: max(1, len(values) // 4)]
    return (
        f"median {statistics.median(values):6.1f} ms, lowest-quartile mean "
        f"{statistics.mean(low):6.1f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--python", help="a lab node of this Python (e.g. 3.12), without vLLM")
    ap.add_argument("versions", nargs="*", help="LABEL=DIR of a remote_scripts/ copy")
    ap.add_argument(
        "--rev", action="append", default=[], help="LABEL=GITREV: a commit, run by its own client"
    )
    args = ap.parse_args()
    pairs = [v.split("=", 1) for v in args.versions]
    revs = [r.split("=", 1) for r in args.rev]
    if not pairs and not revs:
        pairs = [["checkout", str(REPO / "remote_scripts")]]
    book = load_playbook(PLAYBOOK)
    narrowed = {"requires": ["speculators==0.3.0"]} if args.python else {}
    patch = {"op": "patch", **book.patch_request(), **narrowed}
    verify = {"op": "verify", **book.verify_request({"grep", "compile"}), **narrowed}
    installed = {
        "op": "facts",
        "packages_only": True,
        "requires": [{"requirement": p, "package": p} for p in ("speculators", "vllm")],
    }
    scenarios = {
        "start": [{"op": "ping"}],
        "verify": [{"op": "ping"}, verify],
        "patch+verify": [patch, verify],
        "run": [installed, patch, verify],
    }
    with tempfile.TemporaryDirectory(prefix="agent-cpu-") as top:
        lab = Lab(Path(top) / "project")
        node = lab.up(1, progress=lambda m: None, pythons=[args.python] if args.python else None)[0]
        python = subprocess.run(
            [str(node.python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            versions = [
                Version(label, Path(d).expanduser(), Path(top) / f"state-{i}")
                for i, (label, d) in enumerate(pairs)
            ]
            versions += [
                Version.of_rev(label, rev, Path(top), Path(top) / f"state-rev-{i}")
                for i, (label, rev) in enumerate(revs)
            ]
            for v in versions:  # patched once, then every cache warm: the steady state
                _, (applied,) = v.run(node.python, [patch])
                assert applied["ok"] or {i["status"] for i in applied["items"]} == {
                    "already_applied"
                }, applied
                _, answers = v.run(node.python, scenarios["patch+verify"])
                # the requires item reports versions for the client to judge (protocol 2); every
                # other item passes
                assert all(
                    i.get("ok")
                    for a in answers
                    for i in a.get("items", [a])
                    if i.get("kind") != "requires"
                ), answers
            cpu: dict = {(s, v.label): [] for s in scenarios for v in versions}
            bare = []
            for _ in range(args.runs):
                bare.append(_bare(node.python))
                for name, requests in scenarios.items():
                    for v in versions:
                        cpu[(name, v.label)].append(v.run(node.python, requests)[0])
        finally:
            lab.down(purge=True)
    print(f"node python {python}, {args.runs} runs, CPU of the agent process (user + system)")
    print(f"  python -I -S -c pass        {_summary(bare)}")
    for name in scenarios:
        for v in versions:
            print(f"  {name:13s} {v.label:13s} {_summary(cpu[(name, v.label)])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
