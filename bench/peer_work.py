"""The work every peer does on each host: the same checks as fleetops' steady-state `patch verify
--kinds grep,compile`, as three shell commands (one source of truth for the Ansible, pyinfra and
Fabric peers).

Stdlib only: pyinfra imports it from its own venv. `spec` is the JSON that bench/run.py writes from
the playbook (the diffs and the grep checks, with each file relative to site-packages).

    1. patch state: `patch --forward --dry-run` of each diff (already on the node under
       <state>/bench-diffs); "Reversed (or previously applied) patch detected" means already
       applied.
    2. the grep checks, all in one shell command.
    3. `<venv python> -m py_compile` of both files.

`py`, `site` and `diffs` are substituted as given: real paths (pyinfra), Jinja expressions (Ansible)
or "$VAR" references (Fabric, whose per-host values come from the connection's environment).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

APPLIED = "Reversed (or previously applied) patch detected"


def load_spec(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def commands(spec: dict, py: str, site: str, diffs: str) -> list[tuple[str, str]]:
    """[(name, shell command)] for one host."""
    patch_lines = []
    for diff in spec["diffs"]:
        patch_lines.append(
            f"out=$(patch --forward --dry-run --batch -p1 -d {site} -i "
            f"{diffs}/{shlex.quote(diff)} 2>&1); rc=$?; "
            f"if [ $rc -eq 0 ]; then echo {shlex.quote(diff)}': would apply'; "
            f"elif printf '%s' \"$out\" | grep -q {shlex.quote(APPLIED)}; "
            f"then echo {shlex.quote(diff)}': already applied'; "
            f'else echo {shlex.quote(diff)}": patch failed: $out"; fail=1; fi'
        )
    patch_cmd = "fail=0; " + "; ".join(patch_lines) + "; exit $fail"

    grep_lines = []
    for check in spec["greps"]:
        path = f"{site}/{check['file']}"
        pattern, name = shlex.quote(check["pattern"]), shlex.quote(check["name"])
        if check["expect"] == "match":
            grep_lines.append(
                f'if line=$(grep -nE -m1 {pattern} {path}); then echo {name}": ok: $line"; '
                f"else echo {name}': FAILED: no match'; fail=1; fi"
            )
        else:
            grep_lines.append(
                f'if line=$(grep -nE -m1 {pattern} {path}); then echo {name}": FAILED: $line"; '
                f"fail=1; else echo {name}': ok: absent'; fi"
            )
    grep_cmd = "fail=0; " + "; ".join(grep_lines) + "; exit $fail"

    files = " ".join(f"{site}/{rel}" for rel in spec["compile"])
    compile_cmd = f"{py} -m py_compile {files} && echo compiled"
    out = [("patch-state", patch_cmd), ("grep-checks", grep_cmd), ("py-compile", compile_cmd)]
    for _, cmd in out:  # the Ansible peer puts these through Jinja
        assert (
            "{%" not in cmd and "{#" not in cmd and ("{{" not in cmd or "{{" in py + site + diffs)
        ), cmd
    return out
