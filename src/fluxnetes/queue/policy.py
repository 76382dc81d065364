"""Queue policies (qmanager's fcfs / easy / conservative / hybrid) as one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PolicyName = Literal["fcfs", "easy", "conservative", "hybrid"]
ReservationStyle = Literal["pinned", "counted"]
POLICY_NAMES: tuple[PolicyName, ...] = ("fcfs", "easy", "conservative", "hybrid")

#: qmanager defaults (flux-config-sched-fluxion-qmanager): queue-depth 32, reservation-depth 64
DEFAULT_QUEUE_DEPTH = 32
DEFAULT_RESERVATION_DEPTH = 64


class PolicyError(ValueError):
    """A queue policy setting that breaks a rule (the message names the field)."""


@dataclass(frozen=True)
class QueuePolicy:
    """How a scheduling cycle walks the pending queue.

    * ``name``: ``fcfs`` stops at the first job that cannot start now (strict head-of-line
      blocking); ``easy`` reserves for the first job that cannot start and backfills the
      rest only where they do not delay it; ``conservative`` reserves for every job it
      considers; ``hybrid`` reserves for the first ``reservation_depth`` blocked jobs.
    * ``queue_depth``: jobs considered per cycle (the rest wait for a later cycle);
      ``None`` = the whole queue.
    * ``reservation_depth``: hybrid only (default 64).
    * ``reservation_style``: ``pinned`` (Fluxion/qmanager: a reservation is a placement on
      specific resources, recorded in the matcher) or ``counted`` (the classic simulators':
      a reservation is a number of cores from a start time, kept by the queue's core
      profile; backfilled jobs may use any cores as long as the count stays available).
      ``counted`` needs a ``Scheduler`` with ``capacity_cores``.
    """

    name: PolicyName = "fcfs"
    queue_depth: int | None = DEFAULT_QUEUE_DEPTH
    reservation_depth: int | None = None
    reservation_style: ReservationStyle = "pinned"

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise PolicyError(
                f"policy.name: {self.name!r} is not one of {', '.join(POLICY_NAMES)}"
            )
        if self.queue_depth is not None and self.queue_depth < 1:
            raise PolicyError(f"policy.queue_depth: must be >= 1 (got {self.queue_depth})")
        if self.reservation_style not in ("pinned", "counted"):
            raise PolicyError(
                f"policy.reservation_style: {self.reservation_style!r} is not pinned or counted"
            )
        if self.reservation_depth is not None:
            if self.name != "hybrid":
                raise PolicyError(
                    "policy.reservation_depth: only the hybrid policy takes a reservation "
                    f"depth (policy is {self.name})"
                )
            if self.reservation_depth < 0:
                raise PolicyError(
                    f"policy.reservation_depth: must be >= 0 (got {self.reservation_depth})"
                )

    @property
    def reservations(self) -> int | None:
        """How many reservations a cycle may make (None = unlimited, 0 = none)."""
        if self.name == "fcfs":
            return 0
        if self.name == "easy":
            return 1
        if self.name == "conservative":
            return None
        return DEFAULT_RESERVATION_DEPTH if self.reservation_depth is None else self.reservation_depth

    @classmethod
    def parse(
        cls,
        text: str,
        queue_depth: int | None = DEFAULT_QUEUE_DEPTH,
        reservation_style: ReservationStyle = "pinned",
    ) -> QueuePolicy:
        """``fcfs``, ``easy``, ``conservative``, ``hybrid`` or ``hybrid:N`` (N = depth)."""
        name, _, depth = text.strip().lower().partition(":")
        if name not in POLICY_NAMES:
            raise PolicyError(f"policy: {text!r} is not one of {', '.join(POLICY_NAMES)} (or hybrid:N)")
        if depth:
            if name != "hybrid":
                raise PolicyError(f"policy: only hybrid takes a depth ({text!r})")
            try:
                value = int(depth)
            except ValueError:
                raise PolicyError(f"policy: reservation depth in {text!r} is not an integer") from None
            return cls(name="hybrid", queue_depth=queue_depth, reservation_depth=value,
                       reservation_style=reservation_style)
        return cls(name=name, queue_depth=queue_depth, reservation_style=reservation_style)

    def __str__(self) -> str:
        if self.name == "hybrid" and self.reservation_depth is not None:
            return f"hybrid:{self.reservation_depth}"
        return self.name
