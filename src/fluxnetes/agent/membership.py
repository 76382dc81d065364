"""Where the agents' membership comes from, kept current while the agent runs.

- On a cluster: the Node list (list + watch with the operator's informer). Members are the
  Ready nodes matching the agent's node selector, at their InternalIP and the agent port
  (the DaemonSet runs with hostNetwork). A new node whose agent comes up joins; a node that
  is deleted or stops being Ready drops out and its children re-parent.
- Static: ``--peers name=host:port,...`` or ``--peers-file FILE`` (re-read when it changes),
  for tests and for machines outside Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fluxnetes.agent.tree import Member, MembershipError, Tree, members_from_nodes, parse_peers

log = logging.getLogger(__name__)


async def follow_peers_file(path: Path, fanout: int, apply: Callable[[Tree], None],
                            interval: float = 0.5) -> None:
    last: tuple[float, int] | None = None
    while True:
        try:
            st = path.stat()
            stamp = (st.st_mtime, st.st_size)
            if stamp != last:
                last = stamp
                apply(Tree.build(parse_peers(path.read_text()), fanout))
        except (OSError, MembershipError) as exc:
            log.warning("peers file %s: %s (keeping the current membership)", path, exc)
        await asyncio.sleep(interval)


async def follow_nodes(kube: Any, port: int, fanout: int, apply: Callable[[Tree], None],
                       selector: Mapping[str, str] | None = None) -> None:
    from fluxnetes.k8s.informer import Event, Informer
    from fluxnetes.k8s.kube import NODES

    queue: asyncio.Queue[Event] = asyncio.Queue()
    label_selector = ",".join(f"{k}={v}" for k, v in (selector or {}).items()) or None
    informer = Informer(kube, NODES, "Node", queue, label_selector=label_selector)
    task = asyncio.ensure_future(informer.run())
    current: list[Member] | None = None
    try:
        await informer.synced.wait()
        while True:
            await queue.get()
            while not queue.empty():  # a burst of node events -> one recomputation
                queue.get_nowait()
            members = sorted(members_from_nodes(informer.cache.values(), port, selector))
            if members != current:
                current = members
                apply(Tree.build(members, fanout))
    finally:
        task.cancel()
