"""Plans and parsers: the inventory, playbooks, job specs, the GPU gate, unified diffs, YAML with
source positions. Pure: no network, no printing. Everything here can run before anything
connects."""
