"""The host tasks, one module per family: node (ping, trust), gpu (gpu, facts), patching (patch,
rollback), checks (verify), jobs (extract, tail, status, logs, stop). plan.py holds what they share;
registry.py names them all and runs one on one host. Tasks return Results; they never draw (report/
does)."""
