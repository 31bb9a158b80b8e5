"""Stdlib-only code that runs on the nodes, under the target venv's interpreter.

It is shipped as one content-addressed zip (see fleetops/wire/bundle.py); each exec reads one JSON
request on stdin and prints one JSON result. Nothing here may import anything outside the standard
library at module level: the node's venv is what we inspect, not what we depend on.
"""
