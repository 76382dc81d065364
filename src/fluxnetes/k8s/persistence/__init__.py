"""What outlives the process: the FluxJob resource and its status writes, the store journal,
and recovery after a restart (from the cluster and from the store)."""
