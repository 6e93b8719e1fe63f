"""The field types and checks every part of higgsfield.yml's model shares.

A module of their own so each block of the model can live in a module of its own (the
``slurm:`` block is :mod:`higgsfield.control.config.slurm`) with the same rules:
unknown keys refused (:class:`Model`), a number never written as true/false
(:data:`Int`, :data:`Float`, :data:`Port`), a login user never root (:func:`refuse_root`),
a field's check run on each set value (:func:`checked`), a choice of a contract enum read as the
plain strings it is in the JSON Schema (:data:`OnStallChoice`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from higgsfield.contract.names import check_user
from higgsfield.contract.stall_policy import ON_STALL_CHOICES, OnStall

__all__ = ["Float", "Int", "Misplaced", "Model", "OnStallChoice", "Port", "checked", "no_bool", "refuse_root"]


class Misplaced(ValueError):
    """A problem a model validator finds (it reads several fields) that belongs to one of them: it carries
    that field's location, so the one-line message names the field and its line, as a field's own check's
    would."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


def no_bool(v: Any) -> Any:
    # pydantic's lax mode reads YAML's true/false as 1/0; a number field never means a bool.
    if isinstance(v, bool):
        raise ValueError(f"expected a number, not {str(v).lower()}")
    return v


Int = Annotated[int, BeforeValidator(no_bool)]
Float = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(no_bool)]   # .inf would overflow a timer
Port = Annotated[int, Field(ge=1, le=65535), BeforeValidator(no_bool)]
# The contract's OnStall; in the JSON Schema a plain string enum, as a Literal of its values would be.
OnStallChoice = Annotated[OnStall, WithJsonSchema({"enum": list(ON_STALL_CHOICES), "type": "string"})]


def refuse_root(user: str | None) -> str | None:
    return None if user is None else check_user(user)


def checked(*fields: str, check: Callable[[Any], Any]) -> Any:
    """A field validator running ``check`` on each set value (None, the default, is left alone)."""
    return field_validator(*fields)(classmethod(lambda cls, v: v if v is None else check(v)))
