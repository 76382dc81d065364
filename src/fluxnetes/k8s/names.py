"""Names fluxnetes writes into or reads from Kubernetes objects (labels, annotations, gates).

One place, so the webhook, the operator, the CRD and the examples agree on spelling.
"""

from __future__ import annotations

DOMAIN = "fluxnetes.io"

# scheduling gate put on every pod fluxnetes manages; only the operator removes it
GATE = f"{DOMAIN}/gate"
# spec.schedulerName of the pods fluxnetes binds itself (placement "bind", see k8s/admission/hold.py)
SCHEDULER_NAME = "fluxnetes"

# group membership (fluxnetes' own spelling, the one written back by the webhook)
LABEL_GROUP = f"{DOMAIN}/group"
LABEL_GROUP_SIZE = f"{DOMAIN}/group-size"
# also accepted on input
FLUENCE_GROUP = "fluence.flux-framework.org/pod-group"
FLUENCE_GROUP_SIZE = "fluence.flux-framework.org/group-size"
COSCHED_GROUP = "scheduling.x-k8s.io/pod-group"

# set by the webhook on every pod (and pod template) it gated: lets the operator and the
# validating webhook select fluxnetes' pods with a label selector
LABEL_MANAGED = f"{DOMAIN}/managed"
# a namespace (or a single object) opts in / out with this label
LABEL_ENABLED = f"{DOMAIN}/enabled"
# set by the webhook on a pod (and pod template) it holds by fluxnetes' scheduler name, never
# on one that carries fluxnetes' gate: the gate's ValidatingAdmissionPolicy skips these pods by
# label (each of their updates, such as the Job controller's finalizer patch, would otherwise
# cost the API server a CEL evaluation of the whole old and new pod, with no gate to guard;
# docs/scale.md). Only the operator may put it on a gated pod.
LABEL_HOLD = f"{DOMAIN}/hold"
HOLD_SCHEDULER_NAME = "scheduler-name"
# set by the operator on a placed pod: the matcher job id (restart recovery reads it back)
LABEL_JOBID = f"{DOMAIN}/jobid"
# annotation set by the operator on a placed pod: the FluxJob that placed it
ANN_FLUXJOB = f"{DOMAIN}/fluxjob"
# annotation set by the operator on each placed pod of a multi-pod group, in the same write:
# the group's whole allocation (k8s/scheduling/allocation_note.py), so a restart after some
# but not all of its pods were placed knows every slot
ANN_ALLOCATION = f"{DOMAIN}/allocation"

ANN_DURATION = f"{DOMAIN}/duration"
ANN_JOBSPEC = f"{DOMAIN}/jobspec"
ANN_EXCLUSIVE = f"{DOMAIN}/exclusive"

JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

API_GROUP = DOMAIN
API_VERSION = "v1alpha1"
FLUXJOB_PLURAL = "fluxjobs"
FLUXJOB_KIND = "FluxJob"

# the name infix of the group formed by the pods added when a workload scales up after its
# group was allocated (``<group>-scale-<n>``; k8s/groups/scaling.py)
SCALE_SEP = "-scale-"
