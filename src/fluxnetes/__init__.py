"""fluxnetes: graph-based (Fluxion-style) queueing and gang scheduling for Kubernetes."""

__version__ = "0.1.0"
