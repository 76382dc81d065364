"""The agents' tree: ranks by name, Flux's k-ary parents, routing around lost members, and the
membership inputs (peer lists, Node objects, hostlists)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluxnetes.agent.tree import (
    DEFAULT_FANOUT,
    Member,
    MembershipError,
    Tree,
    children_ranks,
    expand_hostlist,
    members_from_nodes,
    parent_rank,
    parse_peers,
    unknown,
)


def members(n: int) -> list[Member]:
    return [Member(f"node{i:03d}", "127.0.0.1", 7000 + i) for i in range(n)]


def test_rank_zero_is_first_by_name_and_parents_are_k_ary() -> None:
    ms = members(10)
    tree = Tree.build(reversed(ms), fanout=3)  # input order does not matter
    assert tree.names == [m.name for m in ms]
    assert tree.rank("node000") == 0
    assert tree.parent("node000") is None
    assert [tree.parent(f"node{i:03d}").name for i in range(1, 10)] == [  # type: ignore[union-attr]
        "node000", "node000", "node000", "node001", "node001", "node001", "node002", "node002", "node002"]
    assert [m.name for m in tree.children("node001")] == ["node004", "node005", "node006"]
    assert [m.name for m in tree.ancestors("node009")] == ["node002", "node000"]
    assert tree.depth() == 2


def test_default_fanout_is_flux_s_256() -> None:
    tree = Tree.build(members(300))
    assert tree.fanout == DEFAULT_FANOUT == 256
    assert tree.parent("node256").name == "node000"  # type: ignore[union-attr]
    assert tree.parent("node257").name == "node001"  # type: ignore[union-attr]
    assert tree.depth() == 2


def test_a_lost_member_is_routed_around_by_the_membership() -> None:
    ms = members(13)
    tree = Tree.build(ms, fanout=3)
    assert tree.parent("node005").name == "node001"  # type: ignore[union-attr]
    # node001 leaves the membership (node deleted / not Ready): ranks shift, node005 gets a new parent
    smaller = Tree.build([m for m in ms if m.name != "node001"], fanout=3)
    assert smaller.rank("node005") == 4
    assert smaller.parent("node005").name == "node002"  # type: ignore[union-attr]
    assert smaller.rank("node001") is None
    assert smaller.ancestors("node001") == []


def test_non_member_has_no_parent_and_no_children() -> None:
    tree = Tree.build(members(4), fanout=2)
    assert tree.parent("elsewhere") is None
    assert tree.children("elsewhere") == []
    assert unknown(["node001", "ghost", "node009"], tree) == ["ghost", "node009"]


def test_build_rejects_bad_fanout_and_conflicting_duplicates() -> None:
    with pytest.raises(MembershipError, match="fanout"):
        Tree.build(members(3), fanout=0)
    with pytest.raises(MembershipError, match="twice"):
        Tree.build([Member("a", "10.0.0.1", 1), Member("a", "10.0.0.2", 1)])
    assert len(Tree.build([Member("a", "10.0.0.1", 1), Member("a", "10.0.0.1", 1)])) == 1


@given(st.integers(min_value=1, max_value=2000), st.integers(min_value=1, max_value=300))
def test_parent_and_children_agree(size: int, fanout: int) -> None:
    seen = {0}
    for r in range(size):
        for c in children_ranks(r, fanout, size):
            assert parent_rank(c, fanout) == r
            assert c > r
            seen.add(c)
    assert seen == set(range(size))  # every rank is reached from rank 0 exactly once


def test_parse_peers() -> None:
    got = parse_peers("a=127.0.0.1:7001, b=host-b:7002\n# comment\nc=[::1]:7003")
    assert got == [Member("a", "127.0.0.1", 7001), Member("b", "host-b", 7002), Member("c", "::1", 7003)]
    for bad in ("a=127.0.0.1", "=1.2.3.4:5", "a=1.2.3.4:70000", "a:1.2.3.4:5"):
        with pytest.raises(MembershipError, match=r"NAME=HOST:PORT|port must"):
            parse_peers(bad)


def _node(name: str, ready: str = "True", ip: str | None = "10.0.0.1", **labels: str) -> dict:
    addrs = [{"type": "InternalIP", "address": ip}] if ip else []
    return {"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addrs}}


def test_members_from_nodes_keeps_ready_nodes_with_an_address() -> None:
    nodes = [_node("b"), _node("a", ip="10.0.0.9"), _node("c", ready="False"), _node("d", ip=None),
             _node("e", role="gpu"), {"metadata": {"name": "f"}}]
    got = Tree.build(members_from_nodes(nodes, 9946), fanout=2)
    assert got.names == ["a", "b", "e"]
    assert got.member("a") == Member("a", "10.0.0.9", 9946)
    assert [m.name for m in members_from_nodes(nodes, 1, {"role": "gpu"})] == ["e"]
    natted = _node("g")
    natted["metadata"]["annotations"] = {"fluxnetes.io/agent-address": "192.0.2.7:31000"}
    assert members_from_nodes([natted], 9946) == [Member("g", "192.0.2.7", 31000)]


def test_expand_hostlist() -> None:
    assert expand_hostlist("node[01-03,7],login") == ["node01", "node02", "node03", "node7", "login"]
    assert expand_hostlist("a,b,a") == ["a", "b"]
    assert expand_hostlist("rack[1-2]-n") == ["rack1-n", "rack2-n"]
    for bad in ("node[3-1]", "node[x]", "node[1", "node]"):
        with pytest.raises(MembershipError, match="hostlist"):
            expand_hostlist(bad)
