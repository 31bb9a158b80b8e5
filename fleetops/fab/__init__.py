"""Fabric's side: the executor that `fab` and `fleet` use (executor.py) and the @fleet_task
decorator the task declarations (tasks.py, the namespace a fabfile imports) use for their host tasks
(decorators.py). Everything else is fleetops' own."""
