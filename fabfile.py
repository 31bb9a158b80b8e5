"""The project's tasks are fleetops' own (fleetops/fab/tasks.py): Fabric's `fab` finds them here."""

from fleetops.fab.tasks import ns  # noqa: F401
