"""Fabric's side: the executor that `fab` and `fleet` use (executor.py) and the @fleet_task decorator the
fabfile declares its host tasks with (decorators.py). Everything else is fleetops' own."""
