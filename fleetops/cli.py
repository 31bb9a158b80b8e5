"""`fleet`: Fabric's `fab` with fleet options (same tasks, same syntax, same fabfile).

    fleet -H @lab --serial 1 patch verify
    fleet -H @gpus --limit 'gpu0*' --forks 8 gpu --wait 600
    fleet -H lab01,lab02 -- uname -a          # Fabric's ad-hoc form, through the inventory (the `run` task)
    fleet --inventory staging/ -H @gpus ping

`fab` works too: there the same settings are options of any host task (`fab -H @lab patch --serial 1`) or
come from FLEETOPS_SERIAL, FLEETOPS_LIMIT, FLEETOPS_FORKS and FLEETOPS_INVENTORY. One difference: plain
`fab -H x -- cmd` (a command and no task) never reads the project (Fabric loads no fabfile and no
fabric.yaml for it), so it is Fabric's own SSH run; use `fleet -H x -- cmd` or `fab -H x run "cmd"`.
"""

from __future__ import annotations

from fabric import Config
from fabric import __version__ as fabric_version
from fabric.main import Fab
from invoke import Argument
from invoke.exceptions import ParseError
from invoke.program import Program

from .fab.executor import FleetExecutor
from .fab.usage import usage_exit


class Fleet(Fab):
    def load_collection(self) -> None:
        # Fabric skips the project for `-- cmd` alone; fleet loads it, so the command goes through the
        # inventory, strict host keys and the audit log (the executor turns it into the `run` task).
        Program.load_collection(self)

    def parse_core(self, *args, **kwargs) -> None:  # type: ignore[override]
        try:
            super().parse_core(*args, **kwargs)
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:
            raise usage_exit(self, ParseError(f"bad option value ({exc})")) from None

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise usage_exit(self, exc) from None
        except ValueError as exc:  # Invoke casts `--serial abc` with int() and lets the ValueError out
            raise usage_exit(self, ParseError(f"bad option value ({exc})")) from None

    def core_args(self):  # type: ignore[override]
        return super().core_args() + [
            Argument(names=("serial",), kind=int, default=0,
                     help="roll out in batches of N hosts; a batch with a failure stops the roll-out"),
            Argument(names=("limit",), kind=str, default="",
                     help="only hosts whose names match these comma-separated patterns (fnmatch)"),
            Argument(names=("forks",), kind=int, default=0, help="hosts worked on at once (default 32)"),
            Argument(names=("inventory",), kind=str, default="",
                     help="inventory directory or .yaml file (env FLEETOPS_INVENTORY); not -i, which is "
                          "Fabric's SSH identity file"),
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
