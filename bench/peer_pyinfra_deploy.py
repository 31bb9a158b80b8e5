"""The pyinfra peer: three server.shell operations (bench/peer_work.py), run by bench/run.py as

    pyinfra --parallel N -y <work>/pyinfra_inventory.py bench/peer_pyinfra_deploy.py

with BENCH_SPEC=<spec.json> in the environment. Per-host paths come from the inventory's host data.
"""

import os
import sys
from pathlib import Path

from pyinfra import host
from pyinfra.operations import server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_work import commands, load_spec

spec = load_spec(os.environ["BENCH_SPEC"])
for name, cmd in commands(spec, host.data.node_python, host.data.node_site, host.data.node_diffs):
    server.shell(name=name, commands=[cmd])
