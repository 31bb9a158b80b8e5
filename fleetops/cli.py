"""`fleet`: Fabric's `fab` with fleet options (same tasks, same syntax, same fabfile).

    fleet -H @lab --serial 1 patch verify
    fleet -H @gpus --limit 'gpu0*' --forks 8 gpu --wait 600

`fab` works too: there the same settings come from FLEETOPS_SERIAL, FLEETOPS_LIMIT and FLEETOPS_FORKS.
"""

from __future__ import annotations

from fabric import Config
from fabric import __version__ as fabric_version
from fabric.main import Fab
from invoke import Argument

from .fab.executor import FleetExecutor


class Fleet(Fab):
    def core_args(self):  # type: ignore[override]
        return super().core_args() + [
            Argument(names=("serial",), kind=int, default=0,
                     help="roll out in batches of N hosts; a batch with a failure stops the roll-out"),
            Argument(names=("limit",), kind=str, default="",
                     help="only hosts whose names match these comma-separated patterns (fnmatch)"),
            Argument(names=("forks",), kind=int, default=0, help="hosts worked on at once (default 32)"),
        ]

    def print_version(self) -> None:
        super().print_version()
        print(f"fleetops (Fabric {fabric_version})")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetops")
    except PackageNotFoundError:
        return "dev"


program = Fleet(name="fleetops", version=_version(), executor_class=FleetExecutor, config_class=Config,
                binary="fleet", binary_names=["fleet"])


def main() -> None:
    program.run()


if __name__ == "__main__":
    main()
