"""The node agent as one content-addressed zip: same code → same bytes → same name, so a node that
already has it is never sent it again."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import remote_scripts

# The zip unpacks itself once beside itself (<name>.d/, content-addressed like the zip), so that Python can
# cache the agent's bytecode there: imports from a zip are compiled again on every exec.
ENTRY = b"""import os, sys
zpath = os.path.abspath(sys.argv[0])
unpacked = zpath[:-4] + ".d"
if not os.path.isdir(unpacked):
    import shutil, zipfile
    tmp = "%s.tmp%d" % (unpacked, os.getpid())
    try:
        with zipfile.ZipFile(zpath) as z:
            z.extractall(tmp)
        os.rename(tmp, unpacked)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another exec won the race, or the disk is full: use the zip
if os.path.isdir(unpacked):
    sys.path.insert(0, unpacked)
from remote_scripts.agent import main
sys.exit(main())
"""


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def filename(self) -> str:
        return f"fleetops-agent-{self.sha256[:20]}.pyz"


@lru_cache(maxsize=1)
def agent_bundle() -> Bundle:
    source_dir = Path(remote_scripts.__file__).parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)

        add("__main__.py", ENTRY)
        for path in sorted(source_dir.glob("*.py")):
            if path.name != "__main__.py":
                add(f"remote_scripts/{path.name}", path.read_bytes())
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest())
