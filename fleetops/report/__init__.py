"""The only code that draws: console.py (per-host lines, live view, recap, JSON document), tables.py (fact,
GPU fleet and job tables, progress bars), history.py (`fab history`). Reads results and answers; imports
nothing from the wire or the tasks."""

from .console import Reporter
from .tables import render_table

__all__ = ["Reporter", "render_table"]
