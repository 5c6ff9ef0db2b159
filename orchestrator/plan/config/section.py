"""The base of every config section: unknown keys are errors, values are frozen and finite."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default on 384 GPUs.
    Every float is finite (`.inf` would pass `gt=0` and turn a timeout or a checkpoint interval
    into "never")."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)
