"""Stamp a benchmark's results with the machine and software that produced them, and write them to disk.

Every published number carries the device, the versions and the date (the course's honesty rules), and
every result file is named after the device it was measured on, so results of several machines sit side
by side: `benchmarks/results/<stem>-<slug>[-<variant>].json/.md/.png`, for example `ladder-h200.json`,
`attention_sweep-cpu.md`, `attention_sweep-a100-sxm4-80gb-causal.png`.

    from course.results import stamp, write_results
    payload = {"stamp": stamp(device), "rows": rows}        # the stamp is required: it names the files
    paths = write_results("ladder", payload, markdown, fig=fig)   # {"json": ..., "md": ..., "png": ...}

A stamp is a flat dict of plain values (JSON-ready): `device` (the GPU's name, or for a CPU the model
name `helpers.core.device.device_report` prints), `device_type`, `slug`, and from that same report `driver`
(NVIDIA driver, None without one), `cuda` (CUDA torch was built with), `torch`, `transformers`, `triton`,
`python`; then `date`
(UTC, ISO 8601), `threads` (torch's CPU threads), `cpu_count` and `load_average_1min` (other work on the
machine disturbs timings: a load above the CPU count means it was competing for the cores).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from helpers.core.device import device_name, device_report, get_device

__all__ = ["stamp", "slug", "name_slug", "write_results"]

# Words in GPU names that tell nothing apart: the vendor and brand names.
_BRAND_WORDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct"}
# Space-separated words about the memory fitted, not the chip: "80GB", "HBM3", "HBM3e" ("H100 80GB HBM3").
_MEMORY_WORD = re.compile(r"^(\d+gb|hbm\d*e?)$")


def name_slug(name: str) -> str:
    """A short lowercase file-name part for a GPU name: "NVIDIA H100 80GB HBM3" -> "h100" (benchmarks)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"need a device name such as 'NVIDIA H200', got {name!r}")
    # space-separated words: drop brand and memory words; dash-joined parts stay ("a100-sxm4-80gb")
    words = [w for w in name.lower().split() if w not in _BRAND_WORDS and not _MEMORY_WORD.match(w)]
    text = re.sub(r"[^a-z0-9]+", "-", " ".join(words) or name.lower()).strip("-")
    return text or "device"


def slug(device: torch.device | str) -> str:
    """The results' file-name part for a device: "cpu", "mps", or the GPU's short name (benchmarks)."""
    dev = get_device(str(device)) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return dev.type
    return name_slug(torch.cuda.get_device_name(dev))


def stamp(device: torch.device | str) -> dict[str, Any]:
    """Device, driver, CUDA, torch, transformers, triton versions, date and threads of a run (benchmarks)."""
    dev = get_device(str(device)) if not isinstance(device, torch.device) else device
    report = device_report()  # the versions lesson 00 prints: one place reads them
    return {
        "device": device_name(dev),
        "device_type": dev.type,
        "slug": slug(dev),
        "driver": report.driver if dev.type == "cuda" else None,
        "cuda": report.cuda_build,
        "torch": report.torch,
        "transformers": report.libraries.get("transformers"),
        "triton": report.libraries.get("triton"),
        "python": report.python,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _plain(value: Any) -> Any:
    """JSON fallback: dataclasses as dicts, paths and dtypes and devices as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (Path, torch.dtype, torch.device)):
        return str(value)
    raise TypeError(f"cannot write a {type(value).__name__} to JSON: convert it to numbers, strings, "
                    "lists or dicts first")


def write_results(stem: str, payload: Mapping[str, Any], markdown: str, fig: Any = None,
                  out_dir: str | Path = "benchmarks/results", *, variant: str = "") -> dict[str, Path]:
    """Write `<stem>-<slug>[-<variant>]` .json (payload), .md and, given a figure, .png (benchmarks)."""
    if not re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)*", stem or ""):
        raise ValueError(f"stem must be a lowercase file-name part such as 'ladder', got {stem!r}")
    if variant and not re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)*", variant):
        raise ValueError(f"variant must be a lowercase file-name part such as 'causal', got {variant!r}")
    run_stamp = payload.get("stamp") if isinstance(payload, Mapping) else None
    if not isinstance(run_stamp, Mapping) or not run_stamp.get("slug"):
        raise ValueError("payload needs a 'stamp' from course.results.stamp(device): it names the files "
                         "after the device and dates the numbers")
    if not isinstance(markdown, str) or not markdown.strip():
        raise ValueError("markdown must be the results as non-empty Markdown text")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / "-".join(p for p in (stem, run_stamp["slug"], variant) if p)
    paths = {"json": base.with_name(base.name + ".json"), "md": base.with_name(base.name + ".md")}
    paths["json"].write_text(json.dumps(payload, indent=2, default=_plain) + "\n")
    paths["md"].write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    if fig is not None:
        paths["png"] = base.with_name(base.name + ".png")
        fig.savefig(paths["png"], dpi=110, bbox_inches="tight")
    return paths
