"""The SSH connector, the one module other layers import from the wire: one connection per host per
run, strict host keys, one agent per host per run (one exec; every call a JSON line on its channel,
and a request handed over by submit() sent before the answers before it are in), and the agent zip
uploaded only when the node does not have that exact version. NodeConnection implements
wire.connector.Connector.

Its parts, one job each: fabconfig (ssh_config, Fabric's Config), hostkeys (known_hosts, the strict
client), tuning (paramiko and Fabric tuned for a fleet), hops (a host's Connection and its jump
hops), errors (a failure to connect as one message), trust (`trust`), session (the agent's channel),
sftp (file transfers), become (the agent as root through sudo), node (NodeConnection)."""

from __future__ import annotations

from fabric import Connection

from ..compat import IndexedHostKeys, PipelinedAuth
from .connector import TransportError
from .errors import connect_error
from .fabconfig import fallback_warning, use_key_passphrases, use_ssh_config
from .hops import IDLE_CHECK_SECONDS, MAX_JUMPS, each_hop, fabric_connection
from .hostkeys import fingerprint_of, known_hosts_files, known_hosts_path
from .keys import keys_to_ask
from .node import NodeConnection
from .trust import trust_host
from .tuning import FleetTransport, identity_key

# Names the tests look inside the parts by.
_fabric_connection, _hops, _identity_key = fabric_connection, each_hop, identity_key
_FleetTransport, _known_hosts_files = FleetTransport, known_hosts_files
_IndexedHostKeys, _PipelinedAuth = IndexedHostKeys, PipelinedAuth

__all__ = [
    "IDLE_CHECK_SECONDS",
    "MAX_JUMPS",
    "Connection",
    "FleetTransport",
    "IndexedHostKeys",
    "NodeConnection",
    "PipelinedAuth",
    "TransportError",
    "connect_error",
    "each_hop",
    "fabric_connection",
    "fingerprint_of",
    "identity_key",
    "known_hosts_files",
    "known_hosts_path",
    "trust_host",
    "fallback_warning",
    "keys_to_ask",
    "use_key_passphrases",
    "use_ssh_config",
    "_FleetTransport",
    "_IndexedHostKeys",
    "_PipelinedAuth",
    "_fabric_connection",
    "_hops",
    "_identity_key",
    "_known_hosts_files",
]
