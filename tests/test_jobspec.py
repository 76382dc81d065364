"""Jobspec parsing/validation (RFC 14 / V1 as Fluxion accepts them) and pod builders."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxnetes.jobspec import (
    UINT_MAX,
    Count,
    JobspecError,
    PodRequest,
    expand_hostlist,
    expand_idset,
    jobspec_from_pods,
    parse_jobspec,
)

REPO = Path(__file__).resolve().parents[1]


def spec(resources: list[dict[str, Any]], **system: Any) -> dict[str, Any]:
    return {"version": 9999, "resources": resources,
            "tasks": [{"command": ["app"], "slot": "default", "count": {"per_slot": 1}}],
            "attributes": {"system": {"duration": 3600, **system}}}


def slot(n: int = 1, *inner: dict[str, Any]) -> dict[str, Any]:
    return {"type": "slot", "count": n, "label": "default", "with": list(inner) or [{"type": "core", "count": 1}]}


def test_examples_parse() -> None:
    for f in sorted((REPO / "examples" / "jobspecs").glob("*.yaml")):
        if f.name.startswith("release"):
            continue
        js = parse_jobspec(f.read_text())
        assert js.resources and js.duration > 0


def test_yaml_and_json_forms_agree() -> None:
    d = spec([slot(2, {"type": "core", "count": 3})])
    a = parse_jobspec(json.dumps(d))
    b = parse_jobspec(parse_jobspec(d).to_yaml())
    assert a.to_dict() == b.to_dict() == parse_jobspec(d).to_dict()
    assert a.totals == {"slot": 2, "core": 6}
    assert a.resources[0].agg == {"core": 3}


@pytest.mark.parametrize(
    ("doc", "path", "rule"),
    [
        (spec([{"type": "slot", "count": 0, "label": "x", "with": [{"type": "core", "count": 1}]}]),
         "resources[0].count", "must be >= 1"),
        (spec([slot(1, {"type": "core", "count": 0})]), "resources[0].with[0].count", "must be >= 1"),
        (spec([{"type": "slot", "count": 1, "with": [{"type": "core", "count": 1}]}]), "resources[0].label",
         "is required for type slot"),
        (spec([slot(1, {"type": "core", "count": 1, "bogus": 2})]), "resources[0].with[0].bogus", "unknown key"),
        (spec([slot(1, {"type": "core", "count": {"min": 2, "max": 1, "operator": "+", "operand": 1}})]),
         "resources[0].with[0].count.max", "must be >= min"),
        (spec([slot(1, {"type": "core", "count": {"min": 1, "max": 4}})]),
         "resources[0].with[0].count.operator", "is required when any of"),
        (spec([slot(1, {"type": "core", "count": {"min": 1, "max": 8, "operator": "^", "operand": 2}})]),
         "resources[0].with[0].count.min", "must be >= 2 for operator '^'"),
        (spec([slot(1, {"type": "core", "count": {"min": 2, "max": 8, "operator": "*", "operand": 1}})]),
         "resources[0].with[0].count.operand", "must be >= 2 for operator '*'"),
        (spec([slot(1, {"type": "core", "count": "0-3"})]), "resources[0].with[0].count",
         "idset/range strings are not supported"),
        (spec([slot(1, {"type": "core", "count": 1, "exclusive": False})]), "resources[0].with[0].exclusive",
         "must not be false inside a slot"),
        (spec([slot(1, {"type": "core", "count": 1}, {"type": "core", "count": 2})]), "resources[0].with[1].type",
         "siblings may not request the same type"),
        (spec([slot()], duration=-1), "attributes.system.duration", "must be >= 0"),
        (spec([slot()], duration="1h"), "attributes.system.duration", "must be a number"),
        ({"version": 0, "resources": [slot()], "tasks": [], "attributes": {}}, "version", "1..9999"),
        ({"version": 9999, "resources": [], "tasks": [], "attributes": {}}, "resources", "non-empty list"),
        ({"version": 9999, "resources": [slot()], "tasks": [], "attributes": {}, "x": 1}, "x", "unknown top-level"),
        (spec([slot()], constraints={"properties": ["a|b"]}), "attributes.system.constraints.properties[0]",
         "may not contain"),
        (spec([slot()], constraints={"bogus": []}), "attributes.system.constraints.bogus", "unknown operator"),
    ],
)
def test_errors_name_path_and_rule(doc: dict[str, Any], path: str, rule: str) -> None:
    with pytest.raises(JobspecError) as ei:
        parse_jobspec(doc)
    assert ei.value.path == path
    assert rule in ei.value.rule
    assert str(ei.value).startswith(f"{path}: ")


def test_bad_text() -> None:
    with pytest.raises(JobspecError, match="not valid YAML"):
        parse_jobspec("version: [1")
    with pytest.raises(JobspecError, match="must be a mapping"):
        parse_jobspec("- 1\n- 2\n")


def test_count_forms() -> None:
    js = parse_jobspec(spec([{"type": "node", "count": {"min": 2}, "exclusive": "true", "with": [slot()]}]))
    c = js.resources[0].count
    assert (c.min, c.max, c.operator, c.operand) == (2, UINT_MAX, "+", 1)
    assert js.resources[0].exclusive is True
    js = parse_jobspec(spec([{"type": "node", "count": {"min": 2, "max": 3, "operator": "+", "operand": 1},
                              "with": [slot()]}]))
    assert js.resources[0].count == Count(2, 3, "+", 1)


def test_duration_is_ceiled_and_defaults_to_zero() -> None:
    assert parse_jobspec(spec([slot()], duration=0.2)).duration == 1
    d = spec([slot()])
    del d["attributes"]["system"]["duration"]
    assert parse_jobspec(d).duration == 0


def test_v1_rules() -> None:
    ok = parse_jobspec((REPO / "examples" / "jobspecs" / "v1_node_slot.yaml").read_text())
    assert ok.version == 1 and ok.totals["core"] == 4
    bad = spec([slot(1, {"type": "memory", "count": 4})])
    bad["version"] = 1
    with pytest.raises(JobspecError, match=r"resources\[0\].with: version 1 slots hold core"):
        parse_jobspec(bad)
    nodur = spec([slot()])
    nodur["version"] = 1
    del nodur["attributes"]["system"]["duration"]
    with pytest.raises(JobspecError, match="is required for version 1"):
        parse_jobspec(nodur)


def test_constraints() -> None:
    class V:
        def __init__(self, name: str, rank: int, props: dict[str, str] | None) -> None:
            self.name, self.rank, self.properties = name, rank, props

    js = parse_jobspec(spec([slot()], constraints={"and": [
        {"properties": ["ssd", "^slow"]},
        {"or": [{"hostlist": ["node[1-3]"]}, {"ranks": ["7"]}]},
        {"not": [{"hostlist": ["node2"]}]}]}))
    c = js.constraint
    assert c is not None
    assert c.match(V("node1", 1, {"ssd": ""}))
    assert not c.match(V("node2", 2, {"ssd": ""}))  # excluded by not
    assert not c.match(V("node3", 3, {"ssd": "", "slow": ""}))
    assert c.match(V("node9", 7, {"ssd": "x"}))
    assert not c.match(V("node9", 8, {"ssd": ""}))
    assert parse_jobspec(spec([slot()], constraints={})).constraint.match(V("a", 0, None))  # type: ignore[union-attr]


def test_hostlist_and_idset() -> None:
    assert expand_hostlist("node[0-2,5],login1") == ["node0", "node1", "node2", "node5", "login1"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_idset("0-2,7") == [0, 1, 2, 7]
    with pytest.raises(ValueError):
        expand_idset("a-b")


def test_pods_builder_mapping() -> None:
    js = jobspec_from_pods(4, PodRequest(cpu_millis=1500, memory_bytes=3 * 2**30 + 1, gpus=1,
                                         extended={"example.com/fpga": 2}), duration=120, name="grp")
    top = js.resources[0]
    assert top.type == "slot" and top.count.min == 4 and top.label == "grp"
    kinds = {r.type: r.count.min for r in top.with_}
    assert kinds == {"core": 2, "memory": 3073, "gpu": 1, "example.com/fpga": 2}
    assert js.duration == 120
    js = jobspec_from_pods(2, PodRequest(cpu_millis=0), exclusive_nodes=True)
    node = js.resources[0]
    assert node.type == "node" and node.exclusive is True and node.count.min == 2
    assert node.with_[0].type == "slot" and node.with_[0].with_[0].count.min == 1  # 0 cpu -> 1 core
    assert js.duration == 0
    with pytest.raises(JobspecError, match="count: must be an integer >= 1"):
        jobspec_from_pods(0, PodRequest(cpu_millis=100))
    with pytest.raises(JobspecError, match=r"request.memory_bytes: must be >= 0"):
        jobspec_from_pods(1, PodRequest(memory_bytes=-1))


@pytest.mark.parametrize(("exclusive", "locality"), [(False, None), (True, None), (False, "socket"), (True, "socket")])
def test_pods_builder_parses_each_shape_once(monkeypatch: pytest.MonkeyPatch, exclusive: bool,
                                             locality: str | None) -> None:
    """Jobs of one template make the same request under their own names: it is parsed once,
    and every group's jobspec is what parsing its own request gives (its label included)."""
    import fluxnetes.jobspec.pods as pods

    parsed: list[Any] = []

    def counting(source: Any) -> Any:
        parsed.append(source)
        return parse_jobspec(source)

    monkeypatch.setattr(pods, "parse_jobspec", counting)
    monkeypatch.setattr(pods, "_SHAPES", {}, raising=False)  # (starts empty)
    req = PodRequest(cpu_millis=1500, memory_bytes=2**30, gpus=1, extended={"example.com/fpga": 2})
    made = [jobspec_from_pods(3, req, duration=60, name=f"job-{i}", exclusive_nodes=exclusive, locality=locality)
            for i in range(20)]
    assert len(parsed) == 1
    for i, js in enumerate(made):
        mine = js.to_dict()
        assert f"job-{i}" in json.dumps(mine) and all(f'"job-{k}"' not in json.dumps(mine) for k in range(20) if k != i)
        assert js == parse_jobspec(mine)  # every field, the derived ones (totals, agg) too
    other = jobspec_from_pods(3, PodRequest(cpu_millis=500), duration=60, name="job-0", exclusive_nodes=exclusive,
                              locality=locality)
    assert len(parsed) == 2 and other.totals["core"] == 3
    assert jobspec_from_pods(3, req, duration=61, name="x", exclusive_nodes=exclusive, locality=locality).duration == 61
    assert len(parsed) == 3


def test_text_cache_returns_same_object() -> None:
    text = json.dumps(spec([slot(3)]))
    assert parse_jobspec(text) is parse_jobspec(text)


# ----------------------------------------------------------------------------- fast YAML path

def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (True == 1 does not count)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _pyyaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=yaml.CSafeLoader)


def test_fast_yaml_reads_the_shipped_jobspecs_like_pyyaml() -> None:
    from fluxnetes.jobspec.fastyaml import load_simple

    files = sorted((REPO / "examples" / "jobspecs").glob("*.yaml")) + sorted(
        (REPO / "bench" / "jobspecs").glob("*.yaml"))
    assert files
    for f in files:
        text = f.read_text()
        fast = load_simple(text)
        assert fast is not None, f  # the common shapes take the fast path
        assert _same(fast, _pyyaml(text)), f


@pytest.mark.parametrize("text", [
    "a: yes\n", "a: on\n", "a: ~\n", "a: 010\n", "a: 1e3\n", "a: 2001-12-14\n", "a: .inf\n",
    "a: 'it''s'\n", 'a: "x\\ty"\n', "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: |\n  x\n",
    "a: b\n  c\n", "a: 1\na: 2\n", "a:\tb\n", "--- \na: 1\n", "a: x#y\n", 'a: ["p, q"]\n',
    "on: 1\n", "- a\nb: 1\n", "a:\n  - 1\n - 2\n", "", "# only a comment\n", "a: {b: 1}\n",
    "a: [1, [2]]\n", "a: b: c\n", "a: \u00e9\n", "a:\u00a0b\n", "a: 1\r\nb: 2\r\n",
])
def test_fast_yaml_leaves_everything_unusual_to_pyyaml(text: str) -> None:
    from fluxnetes.jobspec.fastyaml import load_simple

    assert load_simple(text) is None


def test_fast_yaml_keeps_pyyaml_errors() -> None:
    with pytest.raises(JobspecError, match=r"not valid YAML/JSON: .*\(line 3, column 1\)"):
        parse_jobspec("version: 9999\nresources: [\n")
    with pytest.raises(JobspecError, match=r"resources\[0\]\.count: must be >= 1"):
        parse_jobspec("version: 9999\nresources:\n- type: core\n  count: 0\ntasks: []\n")
    with pytest.raises(JobspecError, match=r"resources\[0\]\.exclusive: must be a boolean"):
        parse_jobspec("version: 9999\nresources:\n- type: node\n  count: 1\n  exclusive: yes please\n"
                      "tasks: []\n")


_ATOMS = ["true", "False", "NULL", "null", "yes", "On", "0", "-0", "7", "012", "1.5", "-2.25", "1e3",
          "app", "node", "default", "nvidia.com/gpu", "a-b_c", "~", '"q"', "'s'", '"a b"', "'x''y'",
          "[ app ]", "[1, 2]", "[]", "x # c", "x#y", "", "a: b", "-", "- z", "{a: 1}", ".5", "_"]


@st.composite
def _yamlish(draw: st.DrawFn) -> str:
    """Random block-YAML-looking text: keys, dashes, atoms and indentation mixed freely."""
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        indent = " " * draw(st.sampled_from([0, 0, 1, 2, 2, 4, 6]))
        head = draw(st.sampled_from(["", "- ", "- - ", "type: ", "count: ", "with:", "- with:",
                                     "- type: ", "k: ", "# c ", "on: ", "a:b "]))
        atom = draw(st.sampled_from(_ATOMS))
        lines.append(indent + head + ("" if head.endswith(":") else atom))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n# end\n"]))


@given(_yamlish())
@settings(max_examples=600, deadline=None)
def test_fast_yaml_agrees_with_pyyaml_on_random_text(text: str) -> None:
    import yaml

    from fluxnetes.jobspec.fastyaml import load_simple

    fast = load_simple(text)
    if fast is None:
        return
    try:
        slow = _pyyaml(text)
    except yaml.YAMLError:
        raise AssertionError(f"fast path accepted invalid YAML {text!r}: {fast!r}") from None
    assert _same(fast, slow), (text, fast, slow)


_SCALARS = st.one_of(
    st.integers(-10**6, 10**6), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
    st.sampled_from(["yes", "no", "on", "null", "true", "010", "1e3", "a #b", "x: y"]))
_DOCS = st.recursive(_SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4),
    st.dictionaries(st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=6),
                    kids, max_size=4)), max_leaves=20)


@given(_DOCS, st.sampled_from([False, None]), st.sampled_from([2, 4]))
@settings(max_examples=400, deadline=None)
def test_fast_yaml_agrees_with_pyyaml_on_dumped_documents(doc: Any, flow: bool | None, indent: int) -> None:
    import yaml

    from fluxnetes.jobspec.fastyaml import load_simple

    text = yaml.safe_dump(doc, default_flow_style=flow, indent=indent, sort_keys=False)
    fast = load_simple(text)
    if fast is not None:
        assert _same(fast, _pyyaml(text)), (text, fast)


@given(st.lists(st.integers(0, 300), max_size=40))
def test_encode_idset_round_trips(ids: list[int]) -> None:
    from fluxnetes.jobspec.constraints import encode_idset

    text = encode_idset(ids)
    assert expand_idset(text) == sorted(set(ids))
    # ranges are maximal: no two parts are adjacent
    parts = [p for p in text.split(",") if p]
    bounds = [(int(p.split("-")[0]), int(p.split("-")[-1])) for p in parts]
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(bounds))


def test_encode_idset_examples() -> None:
    from fluxnetes.jobspec.constraints import encode_idset

    assert encode_idset([]) == ""
    assert encode_idset([4]) == "4"
    assert encode_idset(list(range(64))) == "0-63"
    assert encode_idset({3, 1, 2, 7, 9, 8}) == "1-3,7-9"
    assert encode_idset([5, 5, 6]) == "5-6"
