import pytest

from vllm_tmaguard import codes
from vllm_tmaguard.stages.toggles import TOGGLES, ToggleError, Toggles, parse_toggles, read_toggles


def test_defaults_when_unset() -> None:
    toggles = parse_toggles({})
    assert toggles == Toggles(
        mode="auto", strict=False, log_format="text", root="/", record_dir=toggles.record_dir
    )
    assert toggles.record_dir.startswith("/tmp/tmaguard-")


# Every allowed value and the field it must set, written out here (not derived from TOGGLES).
PARSED = [
    ("TMAGUARD_MODE", "auto", "mode", "auto"), ("TMAGUARD_MODE", "validate", "mode", "validate"),
    ("TMAGUARD_MODE", "off", "mode", "off"),
    ("TMAGUARD_STRICT", "0", "strict", False), ("TMAGUARD_STRICT", "1", "strict", True),
    ("TMAGUARD_GEMM", "auto", "gemm", "auto"), ("TMAGUARD_GEMM", "hopper", "gemm", "hopper"),
    ("TMAGUARD_GEMM", "portable", "gemm", "portable"), ("TMAGUARD_GEMM", "latency", "gemm", "latency"),
    ("TMAGUARD_OVERLAY", "auto", "overlay", "auto"), ("TMAGUARD_OVERLAY", "off", "overlay", "off"),
    ("TMAGUARD_MEMORY", "fit", "memory", "fit"), ("TMAGUARD_MEMORY", "warn", "memory", "warn"),
    ("TMAGUARD_MEMORY", "off", "memory", "off"),
    ("TMAGUARD_LOG_FORMAT", "text", "log_format", "text"),
    ("TMAGUARD_LOG_FORMAT", "json", "log_format", "json"),
    ("TMAGUARD_TRACE", "0", "trace", False), ("TMAGUARD_TRACE", "1", "trace", True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "field", "parsed"), PARSED)
def test_every_allowed_value_parses_to_its_setting(name: str, value: str, field: str, parsed) -> None:
    # Case-insensitive and trimmed, as manifests are written by people.
    assert getattr(parse_toggles({name: f" {value.upper()} "}), field) == parsed
    toggles, problems = read_toggles({name: value})
    assert getattr(toggles, field) == parsed and problems == ()


def test_the_parsed_table_covers_every_allowed_value() -> None:
    listed = {(name, value) for name, value, _, _ in PARSED}
    assert listed == {(spec.name, value) for spec in TOGGLES for value in spec.allowed}


BAD_VALUES = [
    ("TMAGUARD_MODE", "of"),
    ("TMAGUARD_STRICT", "yes"),
    ("TMAGUARD_LOG_FORMAT", "yaml"),
    ("TMAGUARD_GEMM", "fastest"),
    ("TMAGUARD_OVERLAY", "sometimes"),
    ("TMAGUARD_MEMORY", "auto"),
    ("TMAGUARD_TRACE", "on"),
    ("TMAGUARD_ROOT", "relative/dir"),
    ("TMAGUARD_ROOT", "/does/not/exist"),
    ("TMAGUARD_RECORD_DIR", "records"),
    ("TMAGUARD_WHEEL_SHA256", "sha256:" + "0" * 64),
    ("TMAGUARD_WHEEL_SHA256", "abc"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_value_names_variable_value_and_allowed(name: str, value: str) -> None:
    with pytest.raises(ToggleError) as caught:
        parse_toggles({name: value})
    message = str(caught.value)
    assert name in message and repr(value) in message and "allowed:" in message


def test_mode_and_strict_values_map_to_fields(tmp_path) -> None:
    toggles = parse_toggles(
        {
            "TMAGUARD_MODE": "validate",
            "TMAGUARD_STRICT": "1",
            "TMAGUARD_LOG_FORMAT": "json",
            "TMAGUARD_ROOT": str(tmp_path),
            "TMAGUARD_RECORD_DIR": str(tmp_path / "r"),
        }
    )
    assert toggles == Toggles(
        mode="validate", strict=True, log_format="json", root=str(tmp_path), record_dir=str(tmp_path / "r")
    )


def test_every_toggle_has_a_bad_value_case() -> None:
    covered = {name for name, _ in BAD_VALUES}
    assert covered == {spec.name for spec in TOGGLES}


def test_one_bad_toggle_falls_back_alone_and_keeps_the_symbol_fix() -> None:
    toggles, problems = read_toggles({"TMAGUARD_GEMM": "bogus", "TMAGUARD_OVERLAY": "off"})
    assert (toggles.mode, toggles.gemm, toggles.overlay) == ("auto", "auto", "off")
    (problem,) = problems
    assert (problem.code, problem.subject) == (codes.TOGGLE_INVALID, "TMAGUARD_GEMM")
    assert "'bogus'" in problem.cause and "auto" in problem.consequence
    assert "hopper" in problem.fix and "portable" in problem.fix


@pytest.mark.parametrize(
    ("name", "value", "hint"),
    [("TMAGUARD_MODE", "strict", "TMAGUARD_STRICT=1"), ("TMAGUARD_MODE", "on", "TMAGUARD_MODE=auto")],
)
def test_near_misses_get_a_hint(name: str, value: str, hint: str) -> None:
    _, (problem,) = read_toggles({name: value})
    assert f"did you mean {hint}" in problem.fix


def test_a_misspelt_toggle_name_is_named_with_the_nearest_toggle() -> None:
    toggles, (problem,) = read_toggles({"TMAGUARD_STRICTT": "1"})
    assert toggles.strict is False
    assert (problem.code, problem.subject) == (codes.TOGGLE_UNKNOWN, "TMAGUARD_STRICTT")
    assert "TMAGUARD_STRICT" in problem.fix


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_read_toggles_never_raises_on_any_bad_value(name: str, value: str) -> None:
    """Each bad value on its own (a dict of BAD_VALUES would keep one value per name): that toggle at its
    default, one problem naming it, the others untouched."""
    other, other_value, field = ("TMAGUARD_OVERLAY", "off", "overlay")
    if name == other:
        other, other_value, field = ("TMAGUARD_GEMM", "portable", "gemm")
    toggles, (problem,) = read_toggles({name: value, other: other_value})
    assert toggles.mode == "auto" and getattr(toggles, field) == other_value
    assert (problem.code, problem.subject) == (codes.TOGGLE_INVALID, name)


def test_the_overlays_trace_setting_is_a_toggle_not_a_typo() -> None:
    """The overlay and the shims read TMAGUARD_TRACE themselves; it once made every traced run's record say
    'TMAGUARD_TRACE is not a tmaguard toggle'."""
    toggles, problems = read_toggles({"TMAGUARD_TRACE": "1"})
    assert toggles.trace and problems == ()
