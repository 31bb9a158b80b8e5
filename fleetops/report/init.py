"""`fleet init`: what it wrote and what to type next, or which files it would not replace."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..init import InitRefused, make_project
from ..results import EXIT_USAGE

WHAT = {
    "fabfile.py": "one line: Fabric's `fab` finds fleetops' tasks here",
    "fabric.yaml": "the default playbook set and inventory, and the executor `fab` needs",
    "requirements.lock": (
        "the versions of fleetops' dependencies it was tested with (pip --require-hashes)"
    ),
    "hosts/example.yaml": (
        "a real fleet's inventory, as an example: refused as a target until you copy it"
    ),
    ".gitignore": "what fleetops and its lab write into the project",
}


def show_init(directory: str, force: bool = False) -> int:
    try:
        made = make_project(Path(directory), force=force)
    except InitRefused as exc:
        where = shlex.quote(directory)
        print(
            f"fleet init: {exc.directory} already has {', '.join(exc.existing)}: nothing "
            f"written. `fleet init --force {where}` replaces those "
            "files (and leaves the rest of the folder alone).",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except OSError as exc:
        print(
            f"fleet init: {directory}: {exc.strerror or exc}: nothing more written", file=sys.stderr
        )
        return EXIT_USAGE
    print(f"a fleetops project in {made.directory}:")
    playbooks = [rel for rel in made.written + made.replaced if rel.startswith("playbooks/")]
    for rel in made.written + made.replaced:
        if rel in WHAT:
            print(f"  {rel:<20} {WHAT[rel]}{'  (replaced)' if rel in made.replaced else ''}")
    if playbooks:
        books = sorted(rel for rel in playbooks if rel.count("/") == 1 and rel.endswith(".yaml"))
        print(
            f"  {'playbooks/':<20} the shipped playbook set ({len(playbooks)} files), "
            "fabric.yaml's default:"
        )
        print(f"  {'':<20} each host gets the playbook its versions fit")
        for rel in books:
            print(f"    {rel}")
            print(f"      {_requires(made.directory / rel)}")
    print("next:")
    if made.directory != Path.cwd().resolve():
        print(f"  cd {shlex.quote(os.path.relpath(made.directory))}")
    print(
        "  fleet lab.up                   # a local lab "
        "node: real sshd, real vllm 0.16.0 + speculators 0.3.0"
    )
    print("  fleet -H lab01 patch verify    # patch it and prove the patch works")
    print(
        "  a real fleet: copy hosts/example.yaml to "
        "hosts/fleet.yaml, drop `example: true`, name your nodes"
    )
    return 0


def _requires(path: Path) -> str:
    """What a copied playbook is for, from its `requires:` (the file is the package's own)."""
    from ..plans.playbook import load_playbook
    from ..plans.yamlsrc import ConfigError

    try:
        return "for " + ", ".join(load_playbook(path).requires)
    except (ConfigError, OSError) as exc:
        return f"(cannot read it: {exc})"
