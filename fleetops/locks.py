"""The client's lock shipped in the package: requirements.lock, the tested versions of fleetops'
dependencies with the sha256 of every file, for `pip install --require-hashes -r` in a venv of one's
own. scripts/lock writes it here (the checkout's requirements.lock links to it), so the wheel
carries the lock it was tested with."""

from __future__ import annotations

from importlib.resources import files

CLIENT_LOCK = "requirements.lock"


def client_lock() -> str:
    """The text of the lock this fleetops was built with."""
    return files(__package__).joinpath(CLIENT_LOCK).read_text(encoding="utf-8")
