"""Lets `python remote_scripts` and the shipped zip run the agent."""

import sys

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from remote_scripts.core import bootstrap, launch
    from remote_scripts.ops import main
else:  # `python -m remote_scripts`, or the installed package's `python -m fleetops.agent`
    from .core import bootstrap, launch
    from .ops import main

# as the bootstrap hands them in: the writer walks with them
launch.PATHS = (bootstrap.walk, bootstrap.Rules)

sys.exit(main())
