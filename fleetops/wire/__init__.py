"""The wire: how fleetops reaches a node. connector.py states what a connector does (no SSH); ssh.py
is the only code that imports paramiko or Fabric's Connection; bundle.py packs the node agent
(remote_scripts/)."""
