"""fleetops tasks for Fabric's `fab`. Thin: every task hands over to the fleetops library.

    fab lab.up                     # a local lab node: real sshd, real vllm 0.16.0 + speculators 0.3.0
    fab -H lab01 patch verify      # patch the node's speculators, then prove it works
    fab -H lab01 patch --check     # show the diff, change nothing
    fab -H lab01 rollback
"""

from invoke import Collection

from fleetops import lab as _lab
from fleetops.fabtasks import fleet_task, host_task

HELP_PLAYBOOK = "playbook YAML (default: fleetops.playbook in fabric.yaml)"
HELP_JSON = "print one JSON document instead of the human view"


@fleet_task(help={"check": "show the diff that would be applied; write nothing", "playbook": HELP_PLAYBOOK,
            "json": HELP_JSON})
def patch(c, check=False, playbook=None, json=False):
    """Apply the playbook's patches (atomic, backed up, locked; already-applied is a no-op)."""
    return host_task(c, "patch", check=check, playbook=playbook)


@fleet_task(help={"check": "show what would be restored; write nothing", "playbook": HELP_PLAYBOOK, "json": HELP_JSON})
def rollback(c, check=False, playbook=None, json=False):
    """Restore the original files byte for byte (sha256 checked)."""
    return host_task(c, "rollback", check=check, playbook=playbook)


@fleet_task(help={"playbook": HELP_PLAYBOOK, "kinds": "only these check kinds, e.g. grep,compile", "json": HELP_JSON})
def verify(c, playbook=None, kinds=None, json=False):
    """Run every check of the playbook on the node in one exec, with evidence."""
    return host_task(c, "verify", playbook=playbook, kinds=kinds)


@fleet_task(help={"json": HELP_JSON})
def ping(c, json=False):
    """Connect, run the node agent under the target python, report its version."""
    return host_task(c, "ping")


@fleet_task(help={"gpus": "only these GPU indices, e.g. 0,1,2,3", "threshold": "MiB above which a GPU is busy (1024)",
            "wait": "poll up to this many seconds for the GPUs to be free", "json": HELP_JSON})
def gpu(c, gpus=None, threshold=1024, wait=0, json=False):
    """GPU preflight: every GPU there, healthy and free? Who holds the busy ones?"""
    return host_task(c, "gpu", gpus=gpus, threshold=threshold, wait=wait)


@fleet_task(help={"json": HELP_JSON})
def facts(c, json=False):
    """OS, target python, vllm/speculators/torch/transformers versions, driver, CUDA, GPUs, free disk."""
    return host_task(c, "facts")


ns = Collection(ping, patch, rollback, verify, gpu, facts)
ns.add_collection(_lab.collection(), name="lab")
