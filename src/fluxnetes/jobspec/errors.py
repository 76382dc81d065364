"""The jobspec's one error type, in a module of its own so that the parsers (``model``,
``constraints``) can both raise it without importing each other."""

from __future__ import annotations


class JobspecError(ValueError):
    """A jobspec broke a rule; ``path`` names the field, ``rule`` says what was expected."""

    def __init__(self, path: str, rule: str) -> None:
        self.path = path or "jobspec"
        self.rule = rule
        super().__init__(f"{self.path}: {rule}")
