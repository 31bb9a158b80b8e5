"""What the fabfile loads for one command line: the `lab.*` collection (fleetops.lab, with its sshd,
venv and GPU-simulation modules) only when the command may name a lab task or shows the task list,
so that `fab -H lab01 patch verify` does not import the lab (client start-up)."""

from __future__ import annotations

import os
from collections.abc import Sequence

# The programs that parse the command line as Fabric does: fleetops' `fleet`, Fabric's own `fab`,
# and `python -m fabric` (argv[0] is then fabric/__main__.py).
_FAB_PROGRAMS = ("fab", "fleet", "__main__.py")
# Flags that list or describe tasks (every task must be there), given whole or as a prefix
# (--list-format=x).
_LISTING = ("-l", "-h", "--list", "--help", "--complete", "--print-completion-script")
_HOST_FLAGS = ("-H", "--hosts")  # their value is a host (lab01), never a task


def wants_lab(argv: Sequence[str]) -> bool:
    """Whether this command line may need the `lab` collection. True unless `argv` is a fab command
    line whose words cannot name a lab task: no dotted word (`lab.up`), no word starting with `la`
    (`lab`, or a typo whose "did you mean" needs the whole collection) other than a -H value, no
    listing or help flag. Outside `fab` (a script or a test importing the fabfile) the whole
    collection is always there."""
    if not argv or os.path.basename(argv[0]) not in _FAB_PROGRAMS:
        return True
    previous = ""
    for word in argv[1:]:
        if word == "--":  # the ad-hoc command: nothing after it is a task
            break
        if word.startswith("-"):
            if word.startswith(_LISTING):
                return True
        # lab, lab.up, a typo
        elif "." in word or (word.startswith("la") and previous not in _HOST_FLAGS):
            return True
        previous = word
    return False
