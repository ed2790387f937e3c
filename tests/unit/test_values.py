"""The stages' value types (stages/values.py) behave as typing.NamedTuple's classes do: one declaration made
both ways, every behaviour the package or a reader may use compared side by side; and every value type of
the full run's stages is one, with its fields, defaults and methods."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil
import re
import typing
from typing import NamedTuple

import pytest

import vllm_tmaguard.stages
from vllm_tmaguard.stages import values
from vllm_tmaguard.stages.values import value_type

pytestmark = pytest.mark.unit


class Typed(NamedTuple):
    """A layer, as the stages see it."""

    name: str
    size: int
    tags: tuple[str, ...] = ()
    path: str | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.size})"

    def tagged(self, tag: str) -> bool:
        return tag in self.tags


@value_type
class Made:
    """A layer, as the stages see it."""

    name: str
    size: int
    tags: tuple[str, ...] = ()
    path: str | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.size})"

    def tagged(self, tag: str) -> bool:
        return tag in self.tags


@value_type
class Bare:
    one: int


class BareTyped(NamedTuple):
    one: int


def _outcome(call):  # type: ignore[no-untyped-def]
    try:
        return ("value", call())
    except Exception as error:  # the error itself is compared
        return ("error", type(error).__name__, str(error).replace("Typed", "X").replace("Made", "X"))


def _same_shape(value):  # type: ignore[no-untyped-def]
    """What a value shows, with its class's name taken out (the two classes are named apart)."""
    return repr(value).replace("Typed", "X").replace("Made", "X") if isinstance(value, tuple) else value


@pytest.mark.parametrize(
    "use",
    [
        lambda c: c("vcuda", 3),
        lambda c: c("vcuda", 3, ("a",), "/lib"),
        lambda c: c(name="vcuda", size=3, path="/x"),
        lambda c: c("vcuda"),
        lambda c: c("vcuda", 3, (), None, "extra"),
        lambda c: c("vcuda", 3, name="twice"),
        lambda c: c("vcuda", 3, colour="red"),
        lambda c: c("vcuda", 3)._replace(size=4, tags=("b",)),
        lambda c: c("vcuda", 3)._replace(colour="red"),
        lambda c: c("vcuda", 3)._asdict(),
        lambda c: c._make(["a", 1, (), None]),
        lambda c: c._make(["a", 1]),
        lambda c: c._fields,
        lambda c: c._field_defaults,
        lambda c: c.__match_args__,
        lambda c: c.__doc__,
        lambda c: typing.get_type_hints(c),  # typing wraps a string in a ForwardRef; value_type keeps it
        lambda c: re.sub(r"ForwardRef\(('[^']*')\)", r"\1", str(inspect.signature(c))),
        lambda c: c("vcuda", 3).label,
        lambda c: c("vcuda", 3, ("a",)).tagged("a"),
        lambda c: c("vcuda", 3) == ("vcuda", 3, (), None),
        lambda c: hash(c("vcuda", 3)) == hash(("vcuda", 3, (), None)),
        lambda c: (isinstance(c("v", 1), tuple), len(c("v", 1)), c("v", 1)[1], list(c("v", 1))),
        lambda c: c("v", 1).__getnewargs__(),
        lambda c: copy.deepcopy(c("v", 1, ("t",))),
        lambda c: vars(c("v", 1)),
        lambda c: setattr(c("v", 1), "name", "w"),
        lambda c: c.name.__doc__,
    ],
)
def test_a_value_type_behaves_as_typing_namedtuple(use) -> None:  # type: ignore[no-untyped-def]
    typed, made = _outcome(lambda: use(Typed)), _outcome(lambda: use(Made))
    assert typed[0] == made[0], (typed, made)
    if typed[0] == "error":
        assert typed == made
    else:
        assert _same_shape(typed[1]) == _same_shape(made[1])


def test_a_value_type_pickles_and_matches_as_a_namedtuple() -> None:
    value = Made("vcuda", 3, ("a",))
    assert pickle.loads(pickle.dumps(value)) == value and type(pickle.loads(pickle.dumps(value))) is Made
    match value:
        case Made(name, size, tags):
            assert (name, size, tags) == ("vcuda", 3, ("a",))
        case _:
            raise AssertionError("no match")
    assert Bare(1) == BareTyped(1) and repr(Bare(1)) == "Bare(one=1)"
    assert Bare.__doc__ == BareTyped.__doc__.replace("Typed", "")
    names = (Made.__qualname__, Made.__module__, Made.__new__.__qualname__)
    assert names == ("Made", __name__, "Made.__new__")


def test_a_field_without_a_default_after_one_with_is_refused_as_typing_refuses_it() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        @value_type
        class Wrong:
            first: int = 0
            second: int

    with pytest.raises(ValueError, match="underscore"):

        @value_type
        class Hidden:
            _private: int


def test_every_value_type_of_the_full_run_is_made_so() -> None:
    """The stages define their value types with value_type, none with typing.NamedTuple (each of those
    costs a pod's first process ~200 µs on Python 3.12)."""
    made = 0
    for module in pkgutil.iter_modules(vllm_tmaguard.stages.__path__):
        loaded = importlib.import_module(f"vllm_tmaguard.stages.{module.name}")
        for value in vars(loaded).values():
            if isinstance(value, type) and value.__module__ == loaded.__name__ and issubclass(value, tuple):
                assert value._make.__func__ is values._make, f"{value.__qualname__} is no value_type"
                assert value.__new__.__code__.co_varnames[1:] == value._fields, value.__qualname__
                made += 1
    assert made >= 35


def test_every_arity_builds_its_tuple_and_names_its_arguments() -> None:
    """_NEW_BY_ARITY's __new__ for each field count, and the one compiled past it."""
    for arity in range(len(values._NEW_BY_ARITY) + 3):
        fields = [f"field{index}" for index in range(arity)]
        made = value_type(type(f"Value{arity}", (), {"__annotations__": dict.fromkeys(fields, int)}))
        assert made(*range(arity)) == tuple(range(arity)) and made._fields == tuple(fields)
        assert made(**{name: index for index, name in enumerate(fields)}) == tuple(range(arity))
        assert str(inspect.signature(made)) == f"({', '.join(f'{name}: int' for name in fields)})"
