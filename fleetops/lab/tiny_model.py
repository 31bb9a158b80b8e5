"""The tiny model and dataset the lab's `extract` job runs on: made by model.py with the base venv's
python, once per base venv and model.py (kept beside the base venv: making it imports torch, seconds
of CPU) or once per lab where the base venv is not writable, and copied into each node's state
dir."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .common import LabError, Progress, say
from .node import Node

MODEL_PARTS = ("lab-model", "lab-data")  # what model.py makes, copied into each node's state dir


def model_cache(base: Path) -> Path:
    script = Path(__file__).with_name("model.py").read_bytes()
    return base / "fleetops-lab-models" / hashlib.sha256(script).hexdigest()[:16]


def make_model(base: Path, out: Path) -> str | None:
    """model.py run by the base venv's python into `out`; its complaint when that venv has no ML
    stack."""
    proc = subprocess.run(
        [str(base / "bin" / "python"), str(Path(__file__).with_name("model.py")), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode == 3:  # the node venv has no torch/transformers (a packages-only lab)
        return proc.stderr or "no torch/transformers"
    if proc.returncode != 0:
        raise LabError(f"making the lab's tiny model failed: {proc.stderr[-1500:]}")
    return None


def made_model(base: Path) -> Path | None:
    """The tiny model beside the base venv, made on first use (several labs at once: each makes its
    own copy and renames it in place, the first rename wins). None where that directory cannot be
    written."""
    done = model_cache(base)
    if (done / "lab-data" / "prompts.jsonl").exists():
        return done
    try:
        done.parent.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=done.name + ".tmp-", dir=done.parent))
    except OSError:
        return None
    try:
        if make_model(base, tmp) is not None:
            return None
        try:
            tmp.rename(done)
        except OSError:  # another lab was quicker: its copy is as good
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done if (done / "lab-data" / "prompts.jsonl").exists() else None


def give_model(node: Node, base: Path, lab_dir: Path, progress: Progress = say) -> None:
    """The model copied into the node's state dir; nothing when the base venv cannot make one (noted
    in `lab_dir`/no-tiny-model, so the lab tries once)."""
    if (lab_dir / "no-tiny-model").exists():
        return
    made = made_model(base)
    if made is None:
        made = lab_dir / "tiny"
        if not (made / "lab-data" / "prompts.jsonl").exists():
            err = make_model(base, made)
            if err is not None:
                (lab_dir / "no-tiny-model").write_text(err)
                progress(
                    "lab: no tiny model for `extract` (the node venv has no torch/transformers)"
                )
                return
    node.state_dir.mkdir(parents=True, exist_ok=True)
    for part in MODEL_PARTS:
        shutil.copytree(made / part, node.state_dir / part, dirs_exist_ok=True)
