"""What the doctor tests share: how a run of `tmaguard doctor` is examined, and the pods' GPUs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_tmaguard.process import find_package_dir

GOLDEN = Path(__file__).resolve().parent / "golden" / "doctor_vcuda_rtx4090.txt"
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
RTX_5070 = {"gpu_name": "NVIDIA GeForce RTX 5070", "cc": "12.0"}
# Besides the pod-leaking variables, those that change how the doctor prints.
PRINTING = ("COLUMNS", "NO_COLOR", "FORCE_COLOR")
SITE = str(Path(find_package_dir("vllm")).parent)


@dataclass(frozen=True)
class DoctorRun:
    returncode: int
    stdout: str
    stderr: str
    record_dir: Path

    @property
    def report(self) -> dict:
        assert self.stdout.startswith("{"), f"no JSON\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return json.loads(self.stdout)

    def finding(self, finding_id: str, subject: str | None = None) -> dict:
        found = [
            f for f in self.report["findings"] if f["id"] == finding_id and subject in (None, f["subject"])
        ]
        assert found, f"no {finding_id} finding in {[f['id'] for f in self.report['findings']]}"
        return found[0]

    def ids(self, *severities: str) -> set[str]:
        return {f["id"] for f in self.report["findings"] if f["severity"] in severities}


def consumer(report: dict, name: str) -> dict:
    return next(row for row in report["consumers"] if row["name"] == name)


def extension(report: dict, module: str) -> dict:
    return next(e for e in report["architectures"]["extensions"] if e["module"] == module)
