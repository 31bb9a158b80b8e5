"""The Slurm backend (inventory `scheduler: slurm`): `jobs` its tasks, `view` a Slurm job's words
and exit status, `record` a Slurm job of the node's store as `jobs` and `diagnose` show it."""

from .jobs import SLURM, SlurmJobs

__all__ = ["SLURM", "SlurmJobs"]
