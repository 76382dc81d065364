"""Jobspecs: RFC 14 / V1 model, validation with precise errors, builders from pod requests."""

from fluxnetes.jobspec.constraints import Constraint, expand_hostlist, expand_idset
from fluxnetes.jobspec.model import (
    UINT_MAX,
    Count,
    Jobspec,
    JobspecError,
    Resource,
    Task,
    parse_jobspec,
)
from fluxnetes.jobspec.pods import PodRequest, jobspec_from_pods

__all__ = [
    "UINT_MAX",
    "Constraint",
    "Count",
    "Jobspec",
    "JobspecError",
    "PodRequest",
    "Resource",
    "Task",
    "expand_hostlist",
    "expand_idset",
    "jobspec_from_pods",
    "parse_jobspec",
]
