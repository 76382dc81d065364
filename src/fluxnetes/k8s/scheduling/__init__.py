"""Scheduling: one cycle (cycle.py), satisfiability, allocation and placement of a group,
per-node shares, preemption."""
