"""The agent's ground floor: the request loop, the wire protocol and JSON, node file I/O, /proc, the
verifying bootstrap and how the agent relaunches itself. Imports nothing above it."""
