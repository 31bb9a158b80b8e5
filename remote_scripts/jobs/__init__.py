"""Long-running work: SSH jobs (records, keeper, tail, stop), Slurm, shards, fetch plans, ad-hoc
runs and the hidden-state extraction driver."""
