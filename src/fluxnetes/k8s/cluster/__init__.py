"""The cluster view: Nodes and foreign pods mirrored into the graph and matcher, the node
rules (affinity, taints), topology, and the accounting check of the graph against the pods."""
