"""The stages' value types: the class typing.NamedTuple makes (a tuple subclass with its fields as properties,
_fields, _field_defaults, _make, _replace, _asdict, __match_args__, keyword arguments and defaults, the
class body's methods, properties and docstring), defined without what makes each typing.NamedTuple class
cost ~200 µs on Python 3.12: collections.namedtuple compiles a __new__ from source for every class, and
typing checks every annotation. A pod's first process defines every stage's value types (8.9 ms of its
first 40 on the H100: docs/benchmarks.md); here a class costs ~50 µs there (~30 µs on this CPU machine's
3.11). tests/unit/test_values.py holds the two alike. One difference: annotations stay as written (typing
wraps a string in a ForwardRef, compiling it)."""

import types
from collections.abc import Iterable
from typing import Any, TypeVar

try:
    from _collections import _tuplegetter  # what collections.namedtuple uses for its fields
except ImportError:  # pragma: no cover - collections' own fallback
    from operator import itemgetter

    def _tuplegetter(index: int, doc: str) -> Any:
        return property(itemgetter(index), doc=doc)


_tuple_new = _n = tuple.__new__
_NOT_COPIED = frozenset(
    {"__dict__", "__weakref__", "__annotations__", "__annotate__", "__annotations_cache__"}
)
Value = TypeVar("Value")
# collections.namedtuple's __new__ for 0 to 28 fields (record.Record has 27), written out so that they are
# compiled once, into this module's byte code: namedtuple compiles one from source for every class (~70 µs,
# twice that on the H100's Python 3.12). value_type renames the arguments of the one of its arity.
_NEW_BY_ARITY = (
    lambda _c: _n(_c, ()),
    lambda _c, a: _n(_c, (a,)),
    lambda _c, a, b: _n(_c, (a, b)),
    lambda _c, a, b, c: _n(_c, (a, b, c)),
    lambda _c, a, b, c, d: _n(_c, (a, b, c, d)),
    lambda _c, a, b, c, d, e: _n(_c, (a, b, c, d, e)),
    lambda _c, a, b, c, d, e, f: _n(_c, (a, b, c, d, e, f)),
    lambda _c, a, b, c, d, e, f, g: _n(_c, (a, b, c, d, e, f, g)),
    lambda _c, a, b, c, d, e, f, g, h: _n(_c, (a, b, c, d, e, f, g, h)),
    lambda _c, a, b, c, d, e, f, g, h, i: _n(_c, (a, b, c, d, e, f, g, h, i)),
    lambda _c, a, b, c, d, e, f, g, h, i, j: _n(_c, (a, b, c, d, e, f, g, h, i, j)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k: _n(_c, (a, b, c, d, e, f, g, h, i, j, k)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L: _n(_c, (a, b, c, d, e, f, g, h, i, j, k, L)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m: _n(_c, (a, b, c, d, e, f, g, h, i, j, k, L, m)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n: _n(_c, (a, b, c, d, e, f, g, h, i, j, k, L, m, n)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z, A: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z, A)),
    lambda _c, a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z, A, B: _n(_c, (
        a, b, c, d, e, f, g, h, i, j, k, L, m, n, o, p, q, r, s, t, u, v, w, x, y, z, A, B)),
)


def _new_code(arity: int) -> types.CodeType:
    """The code of a __new__ taking `arity` fields after the class: _NEW_BY_ARITY's, or one compiled."""
    if arity < len(_NEW_BY_ARITY):
        return _NEW_BY_ARITY[arity].__code__
    names = "".join(f"_{index}, " for index in range(arity))
    return eval(f"lambda _c, {names}: _n(_c, ({names}))", {"_n": _tuple_new}).__code__


def _make(cls: type[Value], iterable: Iterable[Any]) -> Value:
    result = _tuple_new(cls, iterable)
    if len(result) != len(cls._fields):  # type: ignore[attr-defined]
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")  # type: ignore[attr-defined]
    return result


def _replace(self: Any, /, **changes: Any) -> Any:
    result = self._make(map(changes.pop, self._fields, self))
    if changes:
        raise ValueError(f"Got unexpected field names: {list(changes)!r}")
    return result


def _asdict(self: Any) -> dict[str, Any]:
    return dict(zip(self._fields, self, strict=True))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self, strict=True))
    return f"{type(self).__name__}({shown})"


def _getnewargs(self: Any) -> tuple[Any, ...]:
    return tuple(self)


def value_type(cls: type[Value]) -> type[Value]:
    """The class `cls` declares (annotated fields, then those with defaults; methods, properties, a
    docstring), made a named tuple as typing.NamedTuple would make it."""
    fields = tuple(cls.__annotations__)
    body = vars(cls)
    for name in fields:
        if name.startswith("_") or not name.isidentifier():
            why = "a field name is an identifier without a leading underscore"
            raise ValueError(f"{cls.__qualname__}: {why}: {name!r}")
    defaults = tuple(body[name] for name in fields if name in body)
    if any(name not in body for name in fields[len(fields) - len(defaults) :]):
        raise TypeError(f"{cls.__qualname__}: a field without a default follows one with a default")
    code = _new_code(len(fields)).replace(
        co_varnames=("_cls", *fields), co_name="__new__", co_qualname=f"{cls.__qualname__}.__new__"
    )
    new = types.FunctionType(code, {"_n": _tuple_new}, "__new__", defaults or None)
    arguments = ", ".join(fields) + ("," if len(fields) == 1 else "")  # as collections.namedtuple writes them
    new.__doc__ = f"Create new instance of {cls.__name__}({arguments})"
    new.__annotations__ = dict(cls.__annotations__)
    namespace: dict[str, Any] = {
        **{key: value for key, value in body.items() if key not in _NOT_COPIED and key not in fields},
        "__slots__": (),
        "__annotations__": dict(cls.__annotations__),
        "_fields": fields,
        "_field_defaults": dict(zip(fields[len(fields) - len(defaults) :], defaults, strict=True)),
        "__match_args__": fields,
        "__new__": new,
        "_make": classmethod(_make),
        "_replace": _replace,
        "_asdict": _asdict,
        "__repr__": _repr,
        "__getnewargs__": _getnewargs,
    }
    if namespace["__doc__"] is None:
        namespace["__doc__"] = f"{cls.__name__}({arguments})"
    for index, name in enumerate(fields):
        namespace[name] = _tuplegetter(index, f"Alias for field number {index}")
    return type(cls.__name__, (tuple,), namespace)
