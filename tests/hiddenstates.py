"""Hidden states written in parts (shards, a job array's tasks) compared with a single run's, sample
by sample, in the lab base venv's Python (safetensors and torch are there, not in the client's)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fleetops.lab import base_dir


def compare_to_reference(reference: Path, parts: list[tuple[str, int]]) -> dict:
    """`parts`: each part's output folder and the reference index of its first sample. Every sample
    must have the reference's tensors and input ids (else this fails); the answer: {"checked":
    samples compared, "worst": the largest absolute difference of any hidden state}."""
    script = f"""
import json
from safetensors.torch import load_file
ref, worst, checked = {str(reference)!r}, 0.0, 0
for out, start in {parts!r}:
    for local, entry in json.load(open(out + "/manifest.json"))["samples"].items():
        mine = load_file(out + "/" + entry["file"])
        theirs = load_file(ref + f"/sample_{{start + int(local):07d}}.safetensors")
        assert mine.keys() == theirs.keys() and mine["input_ids"].tolist() == \
theirs["input_ids"].tolist(), local
        for key in mine:
            if key.startswith("hidden_states."):
                worst = max(worst, (mine[key] - theirs[key]).abs().max().item())
        checked += 1
print(json.dumps({{"checked": checked, "worst": worst}}))
"""
    proc = subprocess.run(
        [str(base_dir() / "bin" / "python"), "-c", script], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
