"""The `tmaguard` command (also `python -m vllm_tmaguard`). `doctor` is dispatched before typer is imported:
typer and the pydantic it brings cost ~150 ms, half the doctor's time budget."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["doctor"]:
        from .doctor import main as doctor_main

        raise SystemExit(doctor_main(sys.argv[2:]))
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
