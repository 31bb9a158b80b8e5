"""Runs a runbook (docs/runbooks/*.md, parsed by fleetops.plans.runbooks) against a lab: the lab set
up as its front matter says, every `console lab` command run as typed (bash, in the project, the
venv's `fleet` and Fabric's `fab` first on PATH), its exit status and its shown output lines
checked. A failure names the runbook's file and line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from readmesamples import COLUMNS, REPO, TRIM, mask, normalise

from fleetops.lab import Lab, base_dir, kernel_log
from fleetops.plans.runbooks import Runbook, Step

RUNBOOKS = REPO / "docs" / "runbooks"


class RunbookLab:
    def __init__(self, project: Path, nodes: int) -> None:
        self.project = project
        self.lab = Lab(project)
        self.size = nodes
        self.audit = project / "audit.jsonl"

    def up(self) -> None:
        self.lab.up(self.size, progress=lambda m: print(m, file=sys.stderr))

    def down(self) -> None:
        self.lab.down(purge=True)

    def reset(self) -> None:
        """Every node as `lab.up` left it: running, on the default base with pristine packages, no
        state, idle GPUs, a quiet kernel log, known_hosts with the current host keys; the project
        without fetched files or a re-run list."""
        for node in self.lab.nodes():
            self.lab.start_node(node)
            # a runbook may have moved it to another vLLM (lab.install --vllm)
            self.lab.use_base(node, base_dir())
            for sub in ("backups", "lock.json", "jobs"):
                target = node.state_dir / sub
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
            self.lab.set_gpu_state(node, "idle")
            kernel_log.clear(node)
        self.lab.retrust()
        for leftover in ("fetched", ".fleetops"):
            shutil.rmtree(self.project / leftover, ignore_errors=True)

    def sh(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "COLUMNS": COLUMNS,
            "FLEETOPS_AUDIT_LOG": str(self.audit),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        env.pop("FLEETOPS_TRACE", None)
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=timeout,
        )


def _where(book: Runbook, step: Step) -> str:
    path = book.path.relative_to(REPO) if book.path.is_relative_to(REPO) else book.path
    return f"{path}:{step.line}"


def fits(shown: str, live: str) -> bool:
    """A runbook's line against a real one, both masked as README samples are (timings, ports, pids,
    …); each `…` in the shown line stands for any text."""
    pattern = ".*".join(re.escape(part) for part in mask(shown).split(TRIM))
    return re.fullmatch(pattern, mask(live)) is not None


def missing_line(expect: list[str], live: list[str]) -> str | None:
    """The first shown line that no line of the live output fits (None when all fit). Any order:
    hosts answer in the order they finish."""
    free = list(live)
    for want in expect:
        hit = next((i for i, line in enumerate(free) if fits(want, line)), None)
        if hit is None:
            return want
        free.pop(hit)
    return None


def check(book: Runbook, lab: RunbookLab) -> list[str]:
    """Every way the runbook disagrees with the tool, each naming the runbook's file and line."""
    lab.reset()
    for command in book.setup:
        proc = lab.sh(command)
        if proc.returncode != 0:
            return [
                f"{book.path.name}: lab setup `{command}` exited {proc.returncode}:\n"
                f"{proc.stdout[-2000:]}"
            ]
    problems = []
    for step in book.steps:
        proc = lab.sh(step.command)
        live = normalise(proc.stdout, lab.project)
        cut = live if len(live) <= 60 else [*live[:30], f"… ({len(live) - 60} lines)", *live[-30:]]
        shown = "\n".join("    | " + line for line in cut)
        if proc.returncode != step.exit:
            problems.append(
                f"{_where(book, step)}: `{step.command}` exited {proc.returncode}, the runbook "
                f"says {step.exit}; its output:\n{shown}"
            )
            break  # later steps build on this one
        gone = missing_line(step.expect, live)
        if gone is not None:
            problems.append(
                f"{_where(book, step)}: `{step.command}`: the runbook shows {gone.strip()!r}, "
                f"which is not in the real output; its output:\n{shown}"
            )
    return problems
