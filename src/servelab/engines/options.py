"""Typed `[engine.options]`: each adapter declares the knobs it reads as a pydantic model.

Why a model per engine: options reach an adapter as an untyped table, and a wrong type used to surface
only after the server started (`cpus = "0"` raised `TypeError` with the server left running; `faults =
"hang"` was read one letter at a time). The study validator checks the merged options of every candidate
against its engine's `options_model` (strict types, ranges, known names, no unknown keys), so the error
names its field path before anything launches, in the dry run and the real run alike.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from servelab.engines.base import Engine


class EngineOptions(BaseModel):
    """The options every engine accepts: what the study loop itself reads or fills in."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    python: str | None = Field(default=None, min_length=1, description="the engine's interpreter")
    cpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, description="CPU cores the server is pinned to, e.g. [0, 1]"
    )
    gpu: str | None = Field(default=None, min_length=1, description="GPU kind (default: host.gpu)")
    num_gpus: int | None = Field(default=None, ge=1, description="GPUs in the box (default: host.num_gpus)")
    verify: dict[str, object] | None = Field(default=None, description="arguments of verify-output")


class AnyOptions(BaseModel):
    """What an outside engine without an `options_model` gets: any table, passed through."""

    model_config = ConfigDict(extra="allow")


def options_model(engine: Engine) -> type[BaseModel]:
    """The engine's declared options model (an outside adapter may not declare one: anything goes)."""
    model = getattr(engine, "options_model", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else AnyOptions
