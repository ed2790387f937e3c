"""The values the guard's stages hand each other and the record keeps: what was done (Action) and what is
wrong (Problem). Sentences are rendered from their fields at the edge (record.py, the doctor), never parsed
back."""

from typing import Any

from .values import value_type


@value_type
class Problem:
    code: str
    cause: str  # what is wrong
    consequence: str  # what fails because of it
    fix: str  # the exact fix
    symbol: str | None = None  # the driver entry point concerned
    subject: str | None = None  # the variable, file or module concerned

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


@value_type
class Action:
    kind: str
    target: str  # the library ("overlay", a shim's name), the variable, or the module
    value: str | None = None  # the variable's value, or the library's file
    applied: bool = True  # False: what auto mode would do (validate mode, tmaguard check)
    in_memory: bool = False  # the overlay's file is an anonymous memfd (no private directory for it)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()
