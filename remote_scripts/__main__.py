"""Lets `python remote_scripts` and the shipped zip run the agent."""

import sys

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from remote_scripts.core.agent import main

sys.exit(main())
