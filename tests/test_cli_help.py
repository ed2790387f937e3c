"""`tmaguard --help` and every subcommand's help read cleanly: no value type printed for a flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from podkit import scrubbed_environ

TMAGUARD = str(Path(sys.executable).parent / "tmaguard")


def show_help(*args: str) -> str:
    env = {**scrubbed_environ(), "COLUMNS": "100"}
    done = subprocess.run([TMAGUARD, *args, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def test_the_command_lists_its_subcommands() -> None:
    text = show_help()
    assert text.startswith("Usage: tmaguard [OPTIONS] COMMAND [ARGS]...")
    assert "  --help  Show this message and exit." in text.splitlines()
    listed = [line.split()[0] for line in text.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert listed == ["check", "record", "env", "inject", "manifests", "wheel-configmap", "doctor"]
    commands = text.split("Commands:\n", 1)[1].splitlines()
    assert not [line for line in commands if line.endswith("...")]  # no description cut short


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("check", "  --json  print the record as JSON"),
        ("env", "  --install-dir DIR  write the overlay there"),
    ],
)
def test_subcommand_options_read_cleanly(command: str, option: str) -> None:
    text = show_help(command)
    assert text.startswith(f"Usage: tmaguard {command} [OPTIONS]")
    assert any(line.startswith(option) for line in text.splitlines()), text
    assert "<bool>" not in text and "<str>" not in text


def test_doctor_help_is_argparse_with_metavars() -> None:
    text = show_help("doctor")
    assert text.startswith("usage: tmaguard doctor [-h] [--json] [--save] [--active] [--nvml-timeout")
    assert "<bool>" not in text and "Exit status: 0 healthy" in text
