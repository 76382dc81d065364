"""Settings read from the environment (prefix ``FLUXNETES_``).

Only what several parts share lives here. Kept to plain pydantic + os.environ so the settings
model has no extra dependency.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

ENV_PREFIX = "FLUXNETES_"


def default_store_url() -> str:
    """A SQLite file under the user's data directory (zero setup)."""
    from platformdirs import user_data_dir

    return f"sqlite:///{Path(user_data_dir('fluxnetes')) / 'fluxnetes.db'}"


class Settings(BaseModel):
    store_url: str = Field(
        default_factory=default_store_url,
        description="sqlite:///path or postgresql+psycopg://user@host:port/db (FLUXNETES_STORE_URL)",
    )

    @field_validator("store_url")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        from fluxnetes.store.db import check_url

        check_url(v)
        return v

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for field in cls.model_fields:
            key = ENV_PREFIX + field.upper()
            if env.get(key):
                values[field] = env[key]
        return cls(**values)
