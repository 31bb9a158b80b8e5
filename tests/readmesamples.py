"""README samples kept honest: parse the sample blocks README.md marks with the command that
produced them, run each command on a throwaway lab, compare, and (scripts/readme-samples) write the
live output back.

The convention, in README.md: an HTML comment right before a fenced block without a language tag,

    <!-- sample: fab -H lab01 gpu | after: fab lab.gpu --state busy | exit: 10 -->

`sample:` the command as a user types it (run in the project, lab01 reset to pristine files, no
backups, no lock, idle GPUs); `after:` commands run first, output discarded, `;` between them;
`exit:` the status the command returns. In the block, a line that is only `…` stands for any number
of lines left out, and a line ending in `…` was cut there (its start must match). Paths of the
project become `<checkout>` and the home directory `~`, so no sample names the machine that produced
it. Volatile parts (timings, pids, ports, timestamps, the agent bundle's hash, the lab user, table
border widths) are masked only for the comparison: the README shows the real values of the run that
produced it.

Run as a script (scripts/readme-samples), it rewrites the marked blocks from a live run."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
COLUMNS = "130"  # the terminal width every sample is produced at (tables are drawn to it)
WIDTH = 150  # sample lines longer than this are cut, ending in "…"
TRIM = "…"
PLACEHOLDER = "<checkout>"
MARKER = re.compile(r"^<!--\s*sample:\s*(?P<body>.*?)\s*-->\s*$")
NODES = 4


@dataclass
class Sample:
    command: str
    after: list[str]
    exit: int | None
    marker_line: int  # 0-based index of the marker in README's lines
    start: int  # first line of the block's content
    end: int  # the closing fence's line
    body: list[str] = field(default_factory=list)

    @property
    def ident(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.command.removeprefix("fab ")).strip("-")

    def marker(self, exit_status: int | None = None) -> str:
        parts = [self.command]
        if self.after:
            parts.append("after: " + "; ".join(self.after))
        status = self.exit if exit_status is None else exit_status
        if status is not None:
            parts.append(f"exit: {status}")
        return "<!-- sample: " + " | ".join(parts) + " -->"


class SampleError(Exception):
    """A marker or block README.md cannot be read as a sample."""


def parse_samples(text: str) -> list[Sample]:
    lines = text.split("\n")
    samples: list[Sample] = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        parts = [p.strip() for p in m["body"].split("|")]
        command, after, status = parts[0], [], None
        for part in parts[1:]:
            key, _, value = part.partition(":")
            if key.strip() == "after":
                after = [c.strip() for c in value.split(";") if c.strip()]
            elif key.strip() == "exit" and value.strip().isdigit():
                status = int(value)
            else:
                raise SampleError(
                    f"README.md:{i + 1}: unknown sample field {part!r} (known: after:, exit:)"
                )
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or lines[j].strip() != "```":
            raise SampleError(
                f"README.md:{i + 1}: a sample marker must stand right before a fenced block "
                "without a language tag"
            )
        end = j + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end >= len(lines):
            raise SampleError(f"README.md:{j + 1}: the sample's block is not closed")
        samples.append(Sample(command, after, status, i, j + 1, end, lines[j + 1 : end]))
    return samples


def argv_of(command: str) -> list[str]:
    """The fab arguments of a documented `fab ...` command (what follows `fab`)."""
    words = shlex.split(command)
    if not words or Path(words[0]).name != "fab":
        raise SampleError(f"sample command {command!r} does not start with fab")
    return words[1:]


# ---------------------------------------------------------------- normalising and comparing
def normalise(text: str, project: Path) -> list[str]:
    """Live output as the README shows it: the project's path as <checkout>, the home directory as
    ~."""
    roots = {str(project), str(project.resolve())}
    for root in sorted(roots, key=len, reverse=True):
        # A unified diff's header names the file as a/<path without its leading slash>.
        text = re.sub(
            r"(?m)^(\s*(?:---|\+\+\+) [ab])" + re.escape(root), r"\1/" + PLACEHOLDER, text
        )
        text = text.replace(root, PLACEHOLDER)
    home = str(Path.home())
    if home not in ("/", ""):
        text = re.sub(re.escape(home) + r"(?=/|\b)", "~", text)
    # The probe's script is a temp file on the node: its name changes every run.
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/tmp\w+\.py", "<tmp>/probe.py", text)
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


_MASKS = [
    (re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+"), "<time>"),  # glog (torch)
    (re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b"), "<time>"),  # vLLM's log lines
    (re.compile(r"\b\d\d:\d\d(:\d\d)?\b"), "<time>"),
    (re.compile(r"\bin \d+(\.\d+)? s\b"), "in <dur>"),  # the closing summary line
    (re.compile(r"\b\d+(\.\d+)?(ms|s|m|h)\b"), "<dur>"),
    (re.compile(r"fleetops-agent-[0-9a-f]+\.pyz"), "fleetops-agent-<sha>.pyz"),
    # the agent's hash on the bootstrap's command line
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    # a job id (name-UTC time-random)
    (re.compile(r"\b([\w.]+)-\d{8}T\d{6}-[0-9a-f]{4}\b"), r"\1-<id>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"\b(pids?|port|pid:|process group) \d+(, \d+)*"), r"\1 <n>"),
    # a job's speed, run to run
    (re.compile(r"\btok/s=\d+(\.\d+)?|\b\d+(\.\d+)? tok/s\b(?!=)"), "<rate>"),
    (re.compile(r"\bETA \d+:\d\d\b"), "ETA <eta>"),
    (re.compile(r"\b\d+ (python3?|sleep)\b"), r"<pid> \1"),  # a GPU holder: pid, command
    (re.compile(r"(\d+MiB) \S+ (<dur>)"), r"\1 <user> \2"),  # ... memory, user, age
    (re.compile(r"/tmp\w+\.py"), "/<tmp>.py"),
    (re.compile(r"[━─═]+"), "─"),
    (re.compile(r"\s+"), " "),
]


def mask(line: str) -> str:
    for pattern, repl in _MASKS:
        line = pattern.sub(repl, line)
    return line.strip()


def same(readme_line: str, live_line: str) -> bool:
    want, got = mask(readme_line), mask(live_line)
    cut_want, cut_got = want.endswith(TRIM), got.endswith(TRIM)
    want, got = want.removesuffix(TRIM).rstrip(), got.removesuffix(TRIM).rstrip()
    if cut_want and got.startswith(want):
        return True
    if cut_got and want.startswith(got):
        return True
    return want == got


def is_gap(line: str) -> bool:
    return line.strip() == TRIM


def align(block: list[str], live: list[str]) -> list[int | None] | None:
    """For each block line, the live line it stands for (None for a `…` gap), or None when they
    differ. A gap takes as few lines as it can, so the lines after it pin what it stands for."""
    memo: dict[tuple[int, int], list[int | None] | None] = {}

    def go(i: int, j: int) -> list[int | None] | None:
        if (i, j) in memo:
            return memo[i, j]
        if i == len(block):
            result = [] if j == len(live) else None
        elif is_gap(block[i]):
            result = None
            for k in range(j, len(live) + 1):
                rest = go(i + 1, k)
                if rest is not None:
                    result = [None, *rest]
                    break
        elif j < len(live) and same(block[i], live[j]):
            rest = go(i + 1, j + 1)
            result = None if rest is None else [j, *rest]
        else:
            result = None
        memo[i, j] = result
        return result

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * (len(block) + len(live)) + 1000))
    return go(0, 0)


def first_difference(block: list[str], live: list[str]) -> str:
    """Where the block stops matching: what a failing test shows."""
    n = len(block)
    while n > 0 and align(block[:n] + [TRIM], live) is None:
        n -= 1
    nxt = block[n] if n < len(block) else "(the block ends here, the live output goes on)"
    return (
        f"the block matches up to its line {n}; its next line does not match what follows: {nxt!r}"
    )


def cut(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + TRIM


def regenerate(block: list[str], live: list[str]) -> tuple[list[str], bool]:
    """The block rewritten from live output: the block's `…` gaps kept where it still matches, else
    the whole output (second value False: trim it by hand with `…` lines)."""
    mapping = align(block, live)
    if mapping is None:
        return [cut(line) for line in live], False
    out = []
    for line, j in zip(block, mapping):
        out.append(line if j is None else cut(live[j]))
    return out, True


# ---------------------------------------------------------------- running samples on a lab
class SampleLab:
    """A throwaway lab project of NODES nodes (enough for a folded sample: fab folds from 4 hosts);
    each sample starts from the same state (every node pristine, idle GPUs, a quiet kernel log, no
    jobs)."""

    def __init__(self, project: Path) -> None:
        from fleetops.lab import Lab

        self.project = project
        self.lab = Lab(project)
        self.audit = project / "readme-samples-audit.jsonl"

    def up(self) -> None:
        self.lab.up(NODES, progress=lambda m: print(m, file=sys.stderr))

    def down(self) -> None:
        self.lab.down()

    def reset(self) -> None:
        from fleetops.lab import kernel_log

        for node in self.lab.nodes():
            self.lab.start_node(node)
            self.lab.reset_packages(node)
            # hidden-states: the lab job's output; a complete one would make the next sample's
            # extract a no-op.
            for sub in ("backups", "lock.json", "failpoints.json", "jobs", "hidden-states"):
                target = node.state_dir / sub
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
            self.lab.set_gpu_state(node, "idle")
            kernel_log.clear(node)
        shutil.rmtree(self.project / ".fleetops", ignore_errors=True)
        shutil.rmtree(self.project / "fetched", ignore_errors=True)

    def fab(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "COLUMNS": COLUMNS,
            "FLEETOPS_AUDIT_LOG": str(self.audit),
        }
        env.pop("FLEETOPS_TRACE", None)
        return subprocess.run(
            [sys.executable, "-m", "fabric", *argv_of(command)],
            cwd=self.project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=timeout,
        )

    def run(self, sample: Sample) -> tuple[int, list[str]]:
        self.reset()
        for command in sample.after:
            proc = self.fab(command)
            if proc.returncode != 0:
                raise SampleError(
                    f"`{command}` (before the sample `{sample.command}`) exited "
                    f"{proc.returncode}:\n{proc.stdout[-3000:]}"
                )
        proc = self.fab(sample.command)
        return proc.returncode, normalise(proc.stdout, self.project)


# ---------------------------------------------------------------- the script
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/readme-samples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--check", action="store_true", help="compare only; write nothing; exit 1 on a difference"
    )
    ap.add_argument("--only", default="", help="only the samples whose command contains this text")
    ap.add_argument(
        "--lab",
        default="",
        help="a directory for the throwaway lab project, kept afterwards "
        "(default: a temp directory, removed)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_project

    text = README.read_text()
    try:
        samples = parse_samples(text)
    except SampleError as exc:
        print(f"readme-samples: {exc}", file=sys.stderr)
        return 2
    chosen = [s for s in samples if args.only in s.command]
    if not chosen:
        print(f"readme-samples: no sample in README.md matches {args.only!r}", file=sys.stderr)
        return 2
    temp = None
    if args.lab:
        project = Path(args.lab).resolve()
        if not (project / "fabfile.py").exists():
            make_project(project)
    else:
        temp = Path(tempfile.mkdtemp(prefix="fleetops-readme-"))
        project = make_project(temp / "project")
    lab = SampleLab(project)
    lines = text.split("\n")
    differ = hand = 0
    try:
        lab.up()
        # From the bottom up, so the line numbers of the blocks above stay right while blocks change
        # length.
        for sample in sorted(chosen, key=lambda s: -s.marker_line):
            started = time.monotonic()
            status, live = lab.run(sample)
            matches = align(sample.body, live) is not None and sample.exit in (None, status)
            print(
                f"{'same ' if matches else 'DIFF '} {sample.command}  (exit {status}, "
                f"{time.monotonic() - started:.0f}s)"
            )
            if matches and args.check:
                continue
            if args.check:
                differ += 1
                print("\n".join("    | " + line for line in live))
                continue
            body, kept = regenerate(sample.body, live)
            if not kept:
                hand += 1
                print(
                    "    the output changed shape: the whole output is in the block now; trim "
                    f"it by hand (a line `{TRIM}` stands for lines left out)"
                )
            lines[sample.start : sample.end] = body
            lines[sample.marker_line] = sample.marker(status)
    finally:
        if temp is not None:
            lab.down()
            shutil.rmtree(temp, ignore_errors=True)
    if args.check:
        return 1 if differ else 0
    README.write_text("\n".join(lines))
    print(
        f"README.md: {len(chosen)} sample(s) written"
        + (f"; {hand} to trim by hand" if hand else "")
    )
    return 0


__all__ = [
    "Sample",
    "SampleError",
    "SampleLab",
    "align",
    "argv_of",
    "first_difference",
    "mask",
    "normalise",
    "parse_samples",
    "regenerate",
    "same",
]

if __name__ == "__main__":
    sys.exit(main())
