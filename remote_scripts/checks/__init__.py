"""verify's checks: the fast ones, and the ones that import the node's packages (call sites, in a
forked probe)."""
