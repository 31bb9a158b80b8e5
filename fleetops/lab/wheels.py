"""The wheels a lab node's pip cache holds: a node that pip installed its packages from an index
keeps the downloaded wheels in its pip cache, and `capture` proves a module's pristine bytes from
them. A lab node got its packages by copying the base venv's files, with no index, so the lab packs
the same files back into a wheel (each member checked against the installed RECORD's sha256, as
pip's own install checked them) and puts it in the node's pip cache (`<node>/pip-cache`, the node's
PIP_CACHE_DIR). Built once per lab and base venv, in `.lab/wheels/<base>/`; the base venv is only
read."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import zipfile
from pathlib import Path

from .common import LabError

# A fixed time for every member: the same files give the same wheel bytes on every build.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
PIP_CACHE = "pip-cache"  # in the node's folder, beside its venv and state dir
LAB_WHEELS = "wheels/lab"  # under the node's pip cache: pip itself keeps built wheels under wheels/


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_info(site: Path, package: str) -> Path:
    found = sorted(site.glob(f"{package}-*.dist-info"))
    if len(found) != 1:
        raise LabError(f"{site}: expected one {package}-*.dist-info, found {len(found)}")
    return found[0]


def wheel_name(info: Path) -> str:
    """speculators-0.3.0-py3-none-any.whl from speculators-0.3.0.dist-info and its WHEEL file's
    Tag."""
    tags = [
        line.split(":", 1)[1].strip()
        for line in (info / "WHEEL").read_text().splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise LabError(f"{info / 'WHEEL'} names no Tag")
    return f"{info.name[: -len('.dist-info')]}-{tags[0]}.whl"


def build_wheel(site: Path, package: str, out_dir: Path) -> Path:
    """A wheel of `package` as installed in `site`: every file its RECORD lists inside
    site-packages, each checked against RECORD's sha256 (a file that differs is no pristine copy:
    LabError)."""
    info = dist_info(site, package)
    record = info / "RECORD"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_name(info)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(record, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    # Not in the wheel pip downloaded: what pip wrote outside site-packages (console scripts under
    # ../bin) and the bytecode it compiled at install time.
    rows = [r for r in rows if not r[0].startswith(("../", "/")) and "__pycache__/" not in r[0]]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for row in rows:
            rel = row[0]
            if rel == f"{info.name}/RECORD":
                continue
            data = (site / rel).read_bytes()
            if len(row) > 1 and row[1] and _record_hash(data) != row[1]:
                tmp.unlink()
                raise LabError(
                    f"{site / rel} does not have RECORD's sha256: {site} is no pristine install of "
                    f"{package}; rebuild that venv"
                )
            z.writestr(zipfile.ZipInfo(rel, ZIP_TIME), data)
        kept = io.StringIO()
        csv.writer(kept, lineterminator="\n").writerows(rows)
        z.writestr(zipfile.ZipInfo(f"{info.name}/RECORD", ZIP_TIME), kept.getvalue())
    os.replace(tmp, target)
    return target


def give_wheels(site: Path, packages: tuple[str, ...], built: Path, pip_cache: Path) -> list[Path]:
    """Each package's wheel (built into `built` once) in the node's pip cache, and no other wheel
    there."""
    here = pip_cache / LAB_WHEELS
    here.mkdir(parents=True, exist_ok=True)
    wanted = []
    for package in packages:
        name = wheel_name(dist_info(site, package))
        source = built / name
        if not source.is_file():
            build_wheel(site, package, built)
        dest = here / name
        if not dest.is_file() or dest.read_bytes() != source.read_bytes():
            shutil.copyfile(source, dest)
        wanted.append(dest)
    for other in here.iterdir():
        if other not in wanted:
            other.unlink() if other.is_file() or other.is_symlink() else shutil.rmtree(other)
    return wanted
