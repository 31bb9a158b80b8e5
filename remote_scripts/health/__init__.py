"""Whether the node is fit: GPUs (nvidia-smi), diagnose across jobs, checks and patches, and the
pre-launch check."""
