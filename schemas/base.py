"""Shared pydantic base: every boundary model is strict about unknown fields."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Rejects unknown fields so a typo in a task or request fails loudly, not silently."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)
