"""The node agent (``fluxnetes agent``): hardware discovery, NodeResourceTopology, the tree.

- :mod:`fluxnetes.agent.discovery`: ``discover(root=Path("/sys")) -> NodeHardware`` reads
  the node's NUMA nodes, sockets, cores, GPUs and NICs from sysfs.
- :mod:`fluxnetes.agent.nrt`: ``await publish(kube, node_name, hw)`` writes that as the
  node's NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``).
- ``tree*`` / ``transfer*`` / ``exec*``: the agents' overlay (exec, broadcast).

Heavy imports stay inside functions so ``fluxnetes --help`` stays fast.
"""
