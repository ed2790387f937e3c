"""The values the guard's stages hand each other and the record keeps: what was done (Action) and what is
wrong (Problem). Sentences are rendered from their fields at the edge (record.py, the doctor), never parsed
back."""

from typing import Any, NamedTuple

# Problem codes: stable identifiers the doctor and tests match on (docs/design.md §4).
DRIVER_MISSING = "driver-missing"  # no libcuda.so.1 at all
DRIVER_UNREADABLE = "driver-unreadable"
SYMBOL_UNSUPPLIED = "symbol-unsupplied"  # vLLM needs it, the layer lacks it, nothing here supplies it
HANDLE_SCOPED_GAP = "handle-scoped-gap"  # looked up in libcuda.so.1's handle, which shims cannot answer
OVERLAY_FAILED = "overlay-failed"
SHIM_FAILED = "shim-failed"
ROOT_REFUSED = "root-refused"  # a libcuda.so.1 found only under TMAGUARD_ROOT: nothing is loaded for it
RECORD_DIR_REFUSED = "record-dir-refused"
RECORD_NOT_WRITTEN = "record-not-written"
EXTENSION_UNREADABLE = "extension-unreadable"
IMPORTED_EARLY = "imported-early"  # a TMA-only extension imported before the guard could keep it out
TOGGLE_INVALID = "toggle-invalid"
TOGGLE_UNKNOWN = "toggle-unknown"  # a TMAGUARD_* variable that is not a toggle (a typo of one)
ROUTING_OVERRIDE = "routing-override"  # a user setting the guard had to override
ROUTING_IMPOSSIBLE = "routing-impossible"  # the user insists on what cannot be had (stops start-up)


class Problem(NamedTuple):
    code: str
    cause: str  # what is wrong
    consequence: str  # what fails because of it
    fix: str  # the exact fix
    symbol: str | None = None  # the driver entry point concerned
    subject: str | None = None  # the variable, file or module concerned

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Problem":
        return cls(**{k: data.get(k) for k in ("code", "cause", "consequence", "fix", "symbol", "subject")})


# Action kinds.
LOAD_OVERLAY = "load-overlay"
LOAD_SHIM = "load-shim"
SET_ENV = "set-env"
BLOCK_IMPORT = "block-import"


class Action(NamedTuple):
    kind: str
    target: str  # the library ("overlay", a shim's name), the variable, or the module
    value: str | None = None  # the variable's value, or the library's file
    applied: bool = True  # False: what auto mode would do (validate mode, tmaguard check)
    in_memory: bool = False  # the overlay's file is an anonymous memfd (no private directory for it)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Action":
        return cls(
            data["kind"], data["target"], data.get("value"), data.get("applied", True),
            data.get("in_memory", False),
        )  # fmt: skip
