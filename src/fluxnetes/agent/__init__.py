"""The node agent (``fluxnetes agent``): hardware discovery, NodeResourceTopology, the tree.

- :mod:`fluxnetes.agent.discovery`: ``discover(root=Path("/sys")) -> NodeHardware`` reads
  the node's NUMA nodes, sockets, cores, GPUs and NICs from sysfs.
- :mod:`fluxnetes.agent.nrt`: ``await publish(kube, node_name, hw)`` writes that as the
  node's NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``).
- the agents' tree (exec, broadcast): :mod:`~fluxnetes.agent.overlay` (``Agent``: its server
  and lifecycle) and its parts :mod:`~fluxnetes.agent.parentlink` (the link to the parent),
  :mod:`~fluxnetes.agent.children` (the children, the agents below),
  :mod:`~fluxnetes.agent.downward` (exec requests and transfers coming down) and
  :mod:`~fluxnetes.agent.rootrequests` (clients' requests at rank 0); :mod:`~fluxnetes.agent.link`
  (one connection), :mod:`~fluxnetes.agent.tree` (membership and ranks),
  :mod:`~fluxnetes.agent.transfer`, :mod:`~fluxnetes.agent.execute`, :mod:`~fluxnetes.agent.proto`.

Heavy imports stay inside functions so ``fluxnetes --help`` stays fast.
"""
