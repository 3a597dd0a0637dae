"""Domain values read from database rows by their fields' names.

The modules' frozen dataclasses name their fields after the columns they are
read from; building one is then the same loop for all of them, kept here rather
than restated field by field (and in order) in every ``from_row``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from functools import cache
from typing import TYPE_CHECKING, Any, Self, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
_ABSENT = object()


@cache
def _columns(cls: type[DataclassInstance]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fields a row must hold (no default) and those it may hold."""
    required = tuple(
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    )
    return required, tuple(f.name for f in fields(cls) if f.name not in required)


def build(cls: type[T], row: Mapping[str, Any], **given: Any) -> T:
    """A ``cls`` from ``row``: each field from the column of its name, but those
    in ``given`` (what the row does not hold as such). A field with a default
    keeps it when the row has no such column."""
    required, optional = _columns(cls)
    values = {name: row[name] for name in required if name not in given}
    for name in optional:
        if name not in given and (value := row.get(name, _ABSENT)) is not _ABSENT:
            values[name] = value
    return cls(**values, **given)


class FromRow:
    """``from_row`` for a dataclass whose fields are all columns of its rows."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return build(cls, row)  # type: ignore[type-var]
