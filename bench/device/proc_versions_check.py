"""Checks vllm_tmaguard/csrc/proc_versions.h against a real driver: for every row, the driver's own
cuGetProcAddress_v2 (name, version, flags) must give the function the row names (dlsym of that symbol), for
legacy-stream and, where the row has one, per-thread-default-stream callers. Prints one JSON line.

usage: proc_versions_check.py [REAL_DRIVER]   (default: the file dlopen("libcuda.so.1") gives)"""

from __future__ import annotations

import ctypes
import json
import re
import sys
from pathlib import Path

ROW = re.compile(r'\{"(\w+)", (\d+), "(\w+)", (?:"(\w+)"|NULL)\}')
TABLE = Path(__file__).resolve().parents[2] / "vllm_tmaguard/csrc/proc_versions.h"


def main() -> None:
    driver = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libcuda.so.1")
    look_up = driver.cuGetProcAddress_v2
    look_up.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ]

    def address(symbol: str) -> int | None:
        try:
            return ctypes.cast(getattr(driver, symbol), ctypes.c_void_p).value
        except AttributeError:
            return None

    checked, absent, wrong = 0, [], []
    for name, version, symbol, per_thread in ROW.findall(TABLE.read_text()):
        for flags, expected in ((0, symbol), (2, per_thread)):
            if not expected:
                continue
            fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
            look_up(name.encode(), ctypes.byref(fn), int(version), flags, ctypes.byref(status))
            want = address(expected)
            if want is None:
                absent.append(expected)  # not exported by this driver (removed, or newer than it)
                continue
            checked += 1
            if fn.value != want:
                wrong.append([name, int(version), flags, expected, status.value])
    print("RESULT " + json.dumps({"checked": checked, "absent": absent, "wrong": wrong}))


if __name__ == "__main__":
    main()
