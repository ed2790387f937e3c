"""What a record file must look like to be read back (record.Record.to_json writes schema 2): every field
the readers use (`tmaguard doctor`, `tmaguard record`, the metrics) with its type. A file that is JSON but
not this shape (another program's, a damaged one, a hand-edited one) is said to be so, field by field,
never read as if it were a record (docs/doctor.md, "The record's schema")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SCHEMA = 2
Check = Callable[[Any], bool]


def _of(*types: type) -> Check:
    return lambda value: isinstance(value, types) and not (bool in types) ^ isinstance(value, bool)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _dict_of(check: Check) -> Check:
    return lambda value: isinstance(value, dict) and all(
        isinstance(key, str) and check(item) for key, item in value.items()
    )


def _fields(spec: dict[str, Check]) -> Check:
    return lambda value: isinstance(value, dict) and all(
        name in value and check(value[name]) for name, check in spec.items()
    )


_TEXT, _INT, _BOOL = _of(str), _of(int), _of(bool)
_NUMBER = _of(int, float)
_ANY_DICT = _of(dict)
ACTION = _fields({"kind": _TEXT, "target": _TEXT, "value": _optional(_TEXT), "applied": _BOOL})
PROBLEM = _fields(
    {"code": _TEXT, "cause": _TEXT, "consequence": _TEXT, "fix": _TEXT, "subject": _optional(_TEXT)}
)
GPU = _fields({"index": _INT, "name": _TEXT, "compute_capability": _optional(_TEXT)})

# Each field of schema 2 the readers use, with its type (the others are free).
FIELDS: dict[str, Check] = {
    "schema": _INT,
    "tmaguard": _TEXT,
    "pid": _INT,
    "time": _TEXT,
    "trigger": _TEXT,
    "mode": _TEXT,
    "outcome": _TEXT,
    "summary": _TEXT,
    "layers": _list_of(_fields({"name": _TEXT, "label": _TEXT, "evidence": _list_of(_TEXT)})),
    "libcuda": _fields({"path": _optional(_TEXT), "how": _TEXT}),
    "gpu": _fields({"gpus": _list_of(GPU)}),
    "vllm": _ANY_DICT,
    "lacking": _list_of(_TEXT),
    "missing": _dict_of(_list_of(_TEXT)),
    "supplied": _dict_of(_TEXT),
    "encoder": _optional(_ANY_DICT),
    "tma": _optional(_fields({"usable": _BOOL, "reason": _TEXT})),
    "routing": _optional(_ANY_DICT),
    "actions": _list_of(ACTION),
    "problems": _list_of(PROBLEM),
    "elapsed_ms": _NUMBER,
    "record_file": _optional(_TEXT),
    "forked_from": _optional(_INT),
    "replayed_from": _optional(_INT),
}


# Fields added within schema 2, checked where present (a record of an earlier release lacks them).
LATER_FIELDS: dict[str, Check] = {
    "layer_files": _list_of(
        _fields({"layer": _TEXT, "path": _TEXT, "size": _optional(_INT), "sha256": _optional(_TEXT)})
    ),
}


# A record nests five levels deep; its readers walk it recursively (the doctor's rendering, redaction, the
# JSON encoders), so a deeper one (a free field of a damaged or forged file) is not read as a record.
MAX_DEPTH = 32


def nested_deeper(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `data` has lists or objects nested more than `limit` levels (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False


def why_not_a_record(data: Any) -> str | None:
    """Why `data` is not a record of this schema (None: it is one), naming the first field that is off."""
    if not isinstance(data, dict):
        return f"holds {type(data).__name__}, not a record (a JSON object)"
    if nested_deeper(data):
        return f"nests lists or objects more than {MAX_DEPTH} levels deep (a record nests a few)"
    if data.get("schema") != SCHEMA:
        shown = repr(data.get("schema"))[:60]
        return f"has schema {shown}, not {SCHEMA} (another version of vllm-tmaguard wrote it?)"
    for name, check in FIELDS.items():
        if name not in data:
            return f"lacks the field {name!r}"
        if not check(data[name]):
            return f"has a field {name!r} of the wrong shape ({str(data[name])[:60]!r})"
    for name, check in LATER_FIELDS.items():
        if name in data and not check(data[name]):
            return f"has a field {name!r} of the wrong shape ({str(data[name])[:60]!r})"
    return None
