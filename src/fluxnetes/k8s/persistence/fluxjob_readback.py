"""A group read back from its FluxJob after a restart (``group_from_fluxjob``): its spec,
phase and jobspec as the FluxJob holds them. The jobspec fluxnetes derived itself is derived
again rather than parsed when its text is the one fluxnetes writes (``DerivedTexts``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fluxnetes.k8s.groups import GroupSpec, OwnerRef
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.objects import _meta
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import GPU, PodResources
from fluxnetes.k8s.workloads import kind_of


def group_from_fluxjob(fj: Mapping[str, Any], phase: Phase, make_jobspec: Callable[[Group], Any],
                       derived: DerivedTexts) -> Group:
    """The group a FluxJob in (non-final) ``phase`` describes: spec, kind, phase, reason and
    jobspec (``make_jobspec`` derives fluxnetes' own; ``derived`` tells its text)."""
    meta, spec, st = _meta(fj), fj.get("spec") or {}, fj.get("status") or {}
    req = dict(spec.get("request") or {})
    request = PodResources(int(req.pop("cpu", 0)), int(req.pop("memory", 0)), int(req.pop(GPU, 0)),
                           {k: int(v) for k, v in req.items()})
    wl = spec.get("workload")
    owner = OwnerRef(wl.get("apiVersion", ""), wl.get("kind", ""), wl.get("name", ""), wl.get("uid", "")) if wl else None
    gs = GroupSpec(namespace=meta.get("namespace", "default"), name=meta.get("name", ""),
                   size=int(spec.get("size", 1)), request=request, duration=int(spec.get("duration", 0)),
                   priority=int(spec.get("priority", 0)), owner=owner,
                   jobspec=None, exclusive=bool(spec.get("exclusive", False)))
    g = Group(spec=gs, kind=kind_of(owner.kind) if owner else None, phase=phase, reason=st.get("reason", ""))
    try:
        from fluxnetes.jobspec import parse_jobspec

        text = spec.get("jobspec") or ""
        if not text:
            g.jobspec = make_jobspec(g)
        elif text == derived.text(g):
            # the jobspec fluxnetes derives for this group, as it wrote it: derived
            # again (parsing thousands of FluxJobs' texts took seconds at a restart)
            g.jobspec, g.jobspec_yaml = make_jobspec(g), text
        else:
            g.jobspec = parse_jobspec(text)
    except Exception:
        g.jobspec = make_jobspec(g)
    return g


class DerivedTexts:
    """The text of the jobspec fluxnetes derives for a group (``make_jobspec``, dumped as a
    FluxJob holds it), made once per shape (size, request, duration, exclusive, locality)
    with a placeholder for the group's name, which is the only part that differs between
    groups of one shape; a group whose name the dumper would write differently (quoted)
    simply does not match, and its text is parsed."""

    PLACEHOLDER = "fluxnetesrecoveryplaceholder"

    def __init__(self, make: Any) -> None:
        self.make = make
        self.templates: dict[Any, str | None] = {}

    def text(self, g: Group) -> str | None:
        from fluxnetes.k8s.objects import _dump_jobspec

        s = g.spec
        if s.jobspec:
            return None  # a jobspec of the user's: parsed
        r = s.request
        key = (s.size, r.cpu_millis, r.memory_bytes, r.gpus, tuple(sorted(r.extended.items())),
               s.duration, s.exclusive, s.locality)
        if key not in self.templates:
            try:
                probe = Group(spec=replace(s, name=self.PLACEHOLDER), kind=None)
                self.templates[key] = _dump_jobspec(self.make(probe))
            except Exception:
                self.templates[key] = None
        template = self.templates[key]
        return None if template is None else template.replace(self.PLACEHOLDER, s.name[:60])
