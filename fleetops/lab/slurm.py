"""A throwaway one-node Slurm for the lab: Debian's munged, slurmctld and slurmd (22.05), run as
root in a directory of their own (config, state, spool, logs, munge key and socket), ports on
127.0.0.1.

What differs from a production cluster (the machine has no writable cgroup hierarchy for Slurm and
no accounting database):
- ProctrackType=proctrack/linuxproc and TaskPlugin=task/none: job processes are tracked by parent
  pid, not by a cgroup; nothing confines a job's CPUs, memory or devices.
- Generic resources are two plain files standing in for /dev/nvidia0-1 (gres.conf `File=`):
  `--gres=gpu:1` schedules and is counted, but no real device is bound and CUDA_VISIBLE_DEVICES is
  not set in the job.
- AccountingStorageType=accounting_storage/none: `sacct` answers "Slurm accounting storage is
  disabled"; a finished job is known from `squeue --states=all` (the controller's memory) for
  MinJobAge seconds, then only from the files it wrote.
- Every daemon runs as root (SlurmUser=root), one node, one partition `gpu`.
Every tool finds this cluster through SLURM_CONF=<dir>/etc/slurm.conf (the inventory passes it as
env).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ..agent.core.procfs import pid_alive, pids, read, stat_fields
from .common import LabError, free_port, port_open, settle

DAEMONS = ("munged", "slurmctld", "slurmd")
# how long the cluster's other processes get to exit after the daemons before they are killed
LEAVE_S = 30
GPUS = 2


def missing_binaries() -> list[str]:
    return [
        b
        for b in (*DAEMONS, "sbatch", "squeue", "scancel", "scontrol", "sinfo")
        if not (shutil.which(b) or Path("/usr/sbin", b).exists())
    ]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmLab:
    """One cluster in `root` (made if missing). `up()` starts munged, slurmctld and slurmd and waits
    for the node to be idle; `down()` cancels every job, stops the three daemons by their pid files
    (only processes whose command line names this directory) and waits until no job step of this
    cluster is left."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    def _write_config(self, ctld_port: int, slurmd_port: int) -> None:
        for sub in ("etc", "state", "spool", "run", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        os.chmod(munge, 0o700)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
        for i in range(GPUS):  # stand-ins for /dev/nvidiaN: slurmd only counts the files
            (self.root / "dev" / f"nvidia{i}").touch()
        r = self.root
        conf = [
            "ClusterName=fleetopslab",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.pid_file('slurmd')}",
            f"SlurmctldLogFile={self.log_file('slurmctld')}",
            f"SlurmdLogFile={self.log_file('slurmd')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            "MpiDefault=none",
            "MinJobAge=600",
            "KillWait=5",
            "SchedulerParameters=sched_interval=2",
            "MaxArraySize=1001",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=2000 "
            f"Gres=gpu:{GPUS} State=UNKNOWN",
            f"PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(conf) + "\n")
        (r / "etc" / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={r / 'dev'}/nvidia[0-{GPUS - 1}]\n"
        )

    def _run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env},
        )

    def running(self, daemon: str) -> int | None:
        try:
            pid = int(self.pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        cmdline = read(pid, "cmdline")
        if cmdline is None:
            return None
        return pid if pid_alive(pid) and str(self.root).encode() in cmdline else None

    def up(self, timeout: float = 90) -> None:
        missing = missing_binaries()
        if missing:
            raise LabError(
                f"Slurm lab: missing {', '.join(missing)}; install Debian's slurmctld slurmd munge "
                "slurm-client (scripts/setup does)"
            )
        if os.geteuid() != 0:
            raise LabError(
                "Slurm lab: slurmd must run as root (it starts job steps as the submitting user)"
            )
        if not self.conf.exists():
            self._write_config(free_port(), free_port())
        if not self.running("munged"):
            proc = subprocess.run(
                [
                    _binary("munged"),
                    f"--key-file={self.root / 'munge' / 'munge.key'}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={self.pid_file('munged')}",
                    f"--log-file={self.log_file('munged')}",
                    f"--seed-file={self.root / 'munge' / 'munge.seed'}",
                    "-f",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if proc.returncode != 0:
                raise LabError(
                    f"munged failed to start: {proc.stderr.strip()} (log {self.log_file('munged')})"
                )
        ctld_port = int(
            next(
                ln.split("=", 1)[1]
                for ln in self.conf.read_text().splitlines()
                if ln.startswith("SlurmctldPort=")
            )
        )
        if not self.running("slurmctld"):
            self._start_controller()
        self._wait(lambda: port_open(ctld_port), "slurmctld listening", timeout)
        if not self.running("slurmd"):
            proc = self._run(_binary("slurmd"), "-f", str(self.conf), "-N", self.node)
            if proc.returncode != 0:
                raise LabError(
                    f"slurmd failed to start: {proc.stderr.strip()} (log {self.log_file('slurmd')})"
                )
        self._wait(
            lambda: self.node_state().lower().startswith(("idle", "mix", "alloc")),
            f"node {self.node} idle",
            timeout,
        )

    def has_state(self) -> bool:
        """Whether slurmctld saved a state here (its jobs and id counter): a restart keeps it."""
        state = self.root / "state"
        return state.is_dir() and any(state.iterdir())

    def _start_controller(self) -> None:
        """slurmctld, with `-c` (a clean start) only on a cluster that has no saved state yet: a
        restart keeps its queue, as a production controller does."""
        clean = [] if self.has_state() else ["-c"]
        proc = self._run(_binary("slurmctld"), *clean, "-f", str(self.conf))
        if proc.returncode != 0:
            raise LabError(
                f"slurmctld failed to start: {proc.stderr.strip()} (log "
                f"{self.log_file('slurmctld')})"
            )

    def stop_controller(self, timeout: float = 60) -> bool:
        """Stop slurmctld alone (SIGTERM: it saves its state), as a controller that went down: jobs
        keep running under slurmd. `up()` starts it again with its queue. True when it was
        running."""
        pid = self.running("slurmctld")
        if pid is None:
            return False
        if not _terminate(pid, timeout):
            raise LabError(f"Slurm lab: slurmctld (pid {pid}) did not stop within {timeout:.0f}s")
        return True

    def restart_controller(self, forget: bool = True, timeout: float = 90) -> None:
        """Stop slurmctld and start it again. `forget`: its saved state is removed first and it
        starts with `-c`, so it knows no earlier job and numbers new ones from 1 again: job ids are
        reused, as after a controller that lost its state, or ids wrapping at MaxJobId (`-c` alone
        keeps the id counter in 22.05). No job may be running: slurmd would still hold it."""
        pid = self.running("slurmctld")
        if pid is not None and not _terminate(pid, timeout):
            raise LabError(f"Slurm lab: slurmctld (pid {pid}) did not stop within {timeout:.0f}s")
        ctld_port = int(
            next(
                ln.split("=", 1)[1]
                for ln in self.conf.read_text().splitlines()
                if ln.startswith("SlurmctldPort=")
            )
        )
        self._wait(lambda: not port_open(ctld_port), "slurmctld's port closed", timeout)
        if forget:
            state = self.root / "state"
            shutil.rmtree(state)
            state.mkdir()
        proc = self._run(_binary("slurmctld"), *(["-c"] if forget else []), "-f", str(self.conf))
        if proc.returncode != 0:
            raise LabError(
                f"slurmctld failed to start again: {proc.stderr.strip()} (log "
                f"{self.log_file('slurmctld')})"
            )
        self._wait(lambda: port_open(ctld_port), "slurmctld listening", timeout)
        self._wait(
            lambda: self.node_state().lower().startswith(("idle", "mix", "alloc")),
            f"node {self.node} idle",
            timeout,
        )

    def status(self) -> dict:
        """The daemons' pids (None: not running), the node's state and the queue, for `fab lab.slurm
        status`."""
        daemons = {d: self.running(d) for d in DAEMONS}
        up = bool(daemons["slurmctld"] and daemons["munged"])
        return {
            "root": str(self.root),
            "conf": str(self.conf),
            "daemons": daemons,
            "node": self.node_state() if up else "",
            "jobs": self.jobs() if up else [],
            "state_saved": self.has_state(),
        }

    def node_state(self) -> str:
        proc = self._run("sinfo", "--noheader", "--Node", "--format=%T")
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def _wait(self, check, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        logs = {d: self.log_file(d) for d in DAEMONS}
        tail = {d: (p.read_text()[-800:] if p.exists() else "") for d, p in logs.items()}
        raise LabError(f"Slurm lab: no {what} within {timeout:.0f}s; logs: {tail}")

    def jobs(self) -> list[str]:
        proc = self._run("squeue", "--noheader", "--array", "--format=%i")
        return proc.stdout.split() if proc.returncode == 0 else []

    def down(self, timeout: float = 60) -> list[str]:
        """Cancel this cluster's jobs, then stop slurmd, slurmctld and munged (in that order); then
        wait up to LEAVE_S for the cluster's other processes to exit and SIGKILL what is left.
        Returns the daemons it stopped. Raises LabError if a process of the cluster outlives that
        SIGKILL by `timeout`."""
        if self.running("slurmctld") and self.running("munged"):
            self._run("scancel", "--full", "--partition=gpu", timeout=30)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.jobs():
                time.sleep(0.2)
        stopped = []
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self.running(daemon)
            if pid is None:
                continue
            if not _terminate(pid, timeout):
                _kill(pid)
            stopped.append(daemon)
        # A job step's children and the login node's agent sessions (SLURM_CONF in their
        # environment) leave after the daemons, later still on a busy machine: waited for, then
        # killed by pid, before judging.
        left = settle(self.leftovers, grace=min(timeout, LEAVE_S), timeout=timeout)
        if left:
            raise LabError(
                f"Slurm lab: processes of this cluster outlived down() and SIGKILL: {left}"
            )
        return stopped

    def leftovers(self) -> list[int]:
        """Processes that belong to this cluster: its daemons, and job steps (slurmstepd and what it
        started, whose environment names this cluster's SLURM_CONF)."""
        mine = str(self.root).encode()
        out = []
        for pid in pids():
            if pid == os.getpid():
                continue
            cmdline, environ, fields = read(pid, "cmdline"), read(pid, "environ"), stat_fields(pid)
            if cmdline is None or environ is None or fields is None or fields[0] == "Z":
                continue
            if (
                mine in cmdline
                or (b"SLURM_CONF=" + str(self.conf).encode()) in environ.split(b"\0")
                or (cmdline.startswith(b"slurmstepd") and mine in environ)
            ):
                out.append(pid)
        return out


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """A signal to a process that may have exited since it was found."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, then up to `timeout` for the process to go: True when it went."""
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    return not pid_alive(pid)


def login_inventory(
    slurm: SlurmLab,
    *,
    name: str,
    port: int,
    python: Path,
    state_dir: Path,
    user: str,
    client_key: Path,
    known_hosts: Path,
) -> str:
    """The inventory file of a Slurm login host on a lab node's sshd: `scheduler: slurm` with the
    cluster's partition, one fake GPU a job, a time limit, and SLURM_CONF naming this cluster
    (docs/slurm.md)."""
    return "\n".join(
        [
            (
                f"# Written by `fab lab.slurm up`: {name} is the lab's Slurm login node (the "
                f"cluster in {slurm.root})."
            ),
            "defaults:",
            "  address: 127.0.0.1",
            f"  user: {user}",
            f"  identity_file: {client_key}",
            f"  known_hosts: {known_hosts}",
            "  lab: true",
            "hosts:",
            f"  {name}:",
            f"    port: {port}",
            f"    python: {python}",
            f"    state_dir: {state_dir}",
            "    groups: [lab]",
            "    scheduler: slurm",
            "    partition: gpu",
            "    gres: gpu:1",
            '    time_limit: "00:30:00"',
            "    env:",
            f"      SLURM_CONF: {slurm.conf}",
            "",
        ]
    )
