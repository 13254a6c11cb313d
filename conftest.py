"""pytest set-up for the whole repository: how nbval runs the notebooks.

- cells tagged `requires-cuda` are skipped without a CUDA GPU, `requires-multi-gpu` with fewer than two;
- stderr is never compared (warnings and progress bars differ from run to run);
- nbval waits at most 5 s for each further output message of a cell; slow CI needs longer;
- without CUDA, Triton interprets kernels (TRITON_INTERPRET=1) in the whole session: triton < 3.4 decides
  when it is first imported, and a test module imported before tests/test_kernels.py may import it.
"""

from __future__ import annotations

import os

import pytest

OUTPUT_TIMEOUT_S = 120  # seconds nbval waits for the next output message of a running cell


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


if not _gpu_count():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton in this process


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = None
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:  # not a notebook cell
            continue
        item.output_timeout = OUTPUT_TIMEOUT_S
        skip_compare = getattr(item.parent, "skip_compare", ())
        if "stderr" not in skip_compare:
            item.parent.skip_compare = (*skip_compare, "stderr")
        tags = cell.get("metadata", {}).get("tags", [])
        if "requires-cuda" in tags or "requires-multi-gpu" in tags:
            gpus = _gpu_count() if gpus is None else gpus
            if "requires-cuda" in tags and gpus < 1:
                item.add_marker(pytest.mark.skip(reason="cell tagged requires-cuda; no CUDA GPU here"))
            elif "requires-multi-gpu" in tags and gpus < 2:
                reason = f"cell tagged requires-multi-gpu; {gpus} GPU(s) here"
                item.add_marker(pytest.mark.skip(reason=reason))
