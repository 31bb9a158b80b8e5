"""The `gpu` and `facts` operations on the node: run nvidia-smi, join processes to GPUs by UUID, and
say who holds them (user, age, command, and the fleetops job if it is one of ours). Stdlib only."""

from __future__ import annotations

import json
import os
import sys
import time

from ..core.procfs import read, stat_fields, uptime
from ..core.registry import node_op

# typing.TYPE_CHECKING without importing typing. Every `patch` and `verify` run asks `facts` for the
# installed versions first (packages_only): that answer needs none of nvidia-smi's readers, so
# subprocess, shutil, platform, glob, pwd and nvsmi's ElementTree (~10 ms of node CPU per agent
# start) are imported where used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

SMI_TIMEOUT = 30


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT)


# Where NVIDIA's installers and container runtimes put nvidia-smi, looked in after PATH: sudo's
# secure_path (become) does not hold the driver's own directory
DRIVER_DIRS = (
    "/usr/bin",
    "/usr/local/nvidia/bin",
    "/usr/local/bin",
    "/opt/nvidia/bin",
    "/run/nvidia/driver/usr/bin",
)
# become: the login user's PATH, which sudo replaced with secure_path (the client passes it as `-X`
# to python)
LOGIN_PATH = "fleetops_login_path"


def find_smi() -> str | None:
    return locate_smi()[0]


def locate_smi() -> tuple[str | None, str]:
    """nvidia-smi's path and where it was found, or None and where it was looked for: PATH; under
    become the login user's PATH (only a file that no one but root could have written: root runs
    it); the driver's known directories."""
    import shutil

    found = shutil.which("nvidia-smi")
    if found:
        return found, "on PATH"
    login = sys._xoptions.get(LOGIN_PATH) if os.environ.get("SUDO_USER") else None
    skipped = []
    for where, dirs in (
        ("on the login user's PATH", str(login or "").split(os.pathsep)),
        ("in the driver's directory", DRIVER_DIRS),
    ):
        for folder in filter(None, dirs):
            path = os.path.join(folder, "nvidia-smi")
            if not os.access(path, os.X_OK):
                continue
            why = _untrusted(path) if where.startswith("on the login") else None
            if why is None:
                return path, where
            skipped.append(why)
    looked = (
        f"PATH={os.environ.get('PATH', '')}"
        + (f", the login user's PATH={login}" if login else "")
        + f", {', '.join(DRIVER_DIRS)}"
        + (f"; not run as root: {'; '.join(skipped)}" if skipped else "")
    )
    return None, looked


def _untrusted(path: str) -> str | None:
    """Why root may not run this file of the login user's PATH (a path another user than root can
    change), or None: the bootstrap's own walk, as for the state dir."""
    from ..core.bootstrap import Refused, Rules, walk

    try:
        fd = walk(path, Rules("nvidia-smi", what="nvidia-smi"), final_dir=False)
    except Refused as exc:
        return exc.reason
    if fd is not None:
        os.close(fd)
    return None


def process_info(pid: int) -> dict:
    info: dict = {"user": None, "age_s": None, "command": None, "pgid": None, "visible": False}
    try:
        st = os.stat(f"/proc/{pid}")
        since_boot = uptime()
    except OSError:
        return info  # another PID namespace (containers) or already gone
    fields = stat_fields(pid)
    if fields is None:
        return info
    info["visible"] = True
    import pwd

    try:
        info["user"] = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        info["user"] = str(st.st_uid)
    # field 22 of /proc/PID/stat, counted after the ")" of the comm field
    start_ticks = int(fields[19])
    info["age_s"] = round(since_boot - start_ticks / os.sysconf("SC_CLK_TCK"), 1)
    cmdline = read(pid, "cmdline")
    if cmdline is not None:
        info["command"] = cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:300]
        try:
            info["pgid"] = os.getpgid(pid)
        except OSError:
            pass
    return info


def our_jobs(state_dir: str) -> dict[int, str]:
    """Process groups of jobs this tool launched on the node → job id."""
    import glob

    out = {}
    for path in glob.glob(os.path.join(state_dir, "jobs", "*", "job.json")):
        if os.path.exists(os.path.join(os.path.dirname(path), "exit.json")):
            continue  # ended: its process group id may belong to someone else by now
        try:
            with open(path, encoding="utf-8") as f:
                job = json.load(f)
            out[int(job["pgid"])] = str(job["id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def snapshot(state_dir: str) -> dict:
    from . import nvsmi

    smi, where = locate_smi()
    if smi is None:
        return {
            "ok": False,
            "error_kind": "no_nvidia_smi",
            "error": f"nvidia-smi not found on the node ({where})",
        }
    fields = list(nvsmi.QUERY_FIELDS)
    q = _run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if q.returncode != 0 and "not a valid field" in (q.stdout + q.stderr).lower():
        fields = [f for f in fields if f not in nvsmi.OPTIONAL_FIELDS]
        q = _run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if q.returncode != 0:
        text = (q.stdout + q.stderr).strip()
        return {
            "ok": False,
            "error_kind": "nvidia_smi_failed",
            "exit_code": q.returncode,
            "error": f"nvidia-smi failed (exit {q.returncode}): {text[:500]}",
            "smi": smi,
        }
    apps = _run(
        [
            smi,
            f"--query-compute-apps={','.join(nvsmi.APPS_FIELDS)}",
            "--format=csv,noheader,nounits",
        ]
    )
    try:
        gpus = nvsmi.parse_query(q.stdout, fields)
        orphans = nvsmi.join_processes(
            gpus, nvsmi.parse_apps(apps.stdout) if apps.returncode == 0 else []
        )
    except nvsmi.ParseError as exc:
        return {
            "ok": False,
            "error_kind": "nvidia_smi_failed",
            "error": f"unreadable nvidia-smi output: {exc}",
            "raw": q.stdout[-2000:],
        }
    jobs = our_jobs(state_dir)
    for proc in [p for g in gpus for p in g["processes"]] + orphans:
        proc.update(process_info(proc["pid"]))
        proc["job"] = jobs.get(proc["pgid"]) if proc.get("pgid") is not None else None
    return {
        "ok": True,
        "gpus": gpus,
        "orphans": orphans,
        "smi": smi,
        "fields": fields,
        "apps_error": apps.stderr.strip()[:300] if apps.returncode else None,
        "time": time.time(),
    }


@node_op("gpu", writes=False)
def gpu(req: dict) -> dict:
    return snapshot(req["state_dir"])


def _dist_version(name: str, errors: dict) -> str | None:
    """The installed version, or None when not installed; a package this user cannot read is an
    error (in `errors`), not a missing package (importlib.metadata answers None for an unreadable
    METADATA)."""
    import importlib.metadata as md

    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = None
    except OSError as exc:
        errors[name] = f"cannot read {name}'s metadata: {exc.strerror or exc}"
        return None
    if version is None:
        denied = _unreadable_dist(name)
        if denied:
            errors[name] = f"cannot read {denied} as {_user()}"
    return version


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _unreadable_dist(name: str) -> str | None:
    """A directory on sys.path, or `name`'s dist-info in one, that this user may not read."""
    want = name.lower().replace("-", "_")
    for top in sys.path:
        if not os.path.isdir(top):
            continue
        try:
            entries = os.listdir(top)
        except OSError:
            return top
        for entry in entries:
            if (
                entry.endswith(".dist-info")
                and entry.split("-")[0].lower().replace("-", "_") == want
            ):
                meta = os.path.join(top, entry, "METADATA")
                if not os.access(os.path.join(top, entry), os.R_OK | os.X_OK) or not os.access(
                    meta, os.R_OK
                ):
                    return os.path.join(top, entry)
    return None


def _free_gib(path: str) -> float | None:
    import shutil

    try:
        return round(shutil.disk_usage(path).free / 2**30, 1)
    except OSError:
        return None


@node_op("facts", writes=False)
def facts(req: dict) -> dict:
    # the installed versions of what the pins name (dist-info names), nothing else
    if req.get("packages_only"):
        from ..core.dists import report_versions

        return {"ok": True, "requirements": report_versions(req.get("requires") or [])}
    import platform
    import subprocess

    from ..core import drainmark
    from . import nvsmi

    os_name = platform.platform()
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    errors: dict = {}  # reader -> what it could not read: the client fails the step with it
    out: dict = {
        "ok": True,
        "os": os_name,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_path": sys.executable,
        "venv": sys.prefix,
        "packages": {
            n: _dist_version(n, errors) for n in ("vllm", "speculators", "torch", "transformers")
        },
        "errors": errors,
        "disk_free_gib": {"venv": _free_gib(sys.prefix), "state_dir": _free_gib(req["state_dir"])},
        "drain": drainmark.read(req["state_dir"]),
    }
    if req.get("dists"):  # what `pip check` reads; the client evaluates it
        from ..core.dists import installed_dists

        out["dists"] = installed_dists()
    smi, where = locate_smi()
    out["nvidia_smi"] = f"{smi} ({where})" if smi else None
    if smi is None:
        out.update(
            driver=None, cuda=None, gpu_count=0, gpu_names=[], gpu_error="nvidia-smi not found"
        )
        # become: root's PATH is sudo's, not the node's: say it, never "ok"
        if os.environ.get("SUDO_USER"):
            errors["gpus"] = f"nvidia-smi not found as root under sudo ({where})"
        return out
    try:
        table = _run([smi])
        snap = snapshot(req["state_dir"])
    except (OSError, subprocess.SubprocessError) as exc:  # one reader: the other facts still stand
        errors["gpus"] = f"cannot run {smi} as {_user()}: {getattr(exc, 'strerror', None) or exc}"
        out.update(driver=None, cuda=None, gpu_count=None, gpu_names=[])
        return out
    header = nvsmi.parse_table_header(table.stdout)
    out.update(driver=header["driver"], cuda=header["cuda"])
    if snap["ok"]:
        out.update(gpu_count=len(snap["gpus"]), gpu_names=sorted({g["name"] for g in snap["gpus"]}))
    else:
        out.update(gpu_count=None, gpu_names=[], gpu_error=snap["error"])
    return out
