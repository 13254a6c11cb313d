"""Companion package of the course: the tools each lesson builds, in polished form.

Import what you need from its module (`from helpers.timing import benchmark`); the submodules load
lazily, so `import helpers` is cheap and does nothing at import time.

| layer | module | lesson | main entry points |
|---|---|---|---|
| base | `config` | all | `get_profile`, `pick`, `seed_everything`, `hub_offline` |
| base | `sizing` | all | `fit_sizes`, `Size`, `device_memory`, `MARGIN` |
| base | `compat` | all | `require`, `at_least`, `set_attn_implementation`, `unwrap_model` |
| base | `tables` | all | `Table` |
| base | `timing` | 00-06 | `benchmark`, `time_once`, `compare`, `cold_start` |
| base | `precision` | 02 (03-08) | `PRECISIONS`, `check_precision`, `autocast_context`, `tf32_matmuls` |
| base | `device` | all | `get_device`, `device_report`, `device_name`, `device_facts` |
| base | `diagnosis` | 00 | `diagnose`, `explain_error`, `findings_table` |
| base | `paths` | 03, 05-08 | `script`, `solutions_dir`, `output_dir` |
| base | `adapt` | 02-08 | `as_course_model`, `as_batch`, `ModelShape` |
| base | `nbrun` | make course, make site | `CourseKernelManager`, `SlicedChannel` |
| measure | `roofline` | 00, 02, 08 | `measure_roofline`, `load_roofline`, `peak_flops`, `mfu_peak` |
| measure | `gpus` | 09 | `GPUS`, `gpu` |
| base | `verdicts` | 00-08 | `MeasuredTable`, `Range`, `AtLeast`, `AtMost`, `PairedRatio` |
| measure | `flops` | 02, 08 | `model_flops_per_token`, `executed_flops`, `mfu` |
| measure | `memory` | 03 | `track_peak_memory`, `estimate_training_memory`, `memory_timeline` |
| measure | `results` | benchmarks | `stamp`, `slug`, `write_results` |
| measure | `opcount` | 04 (05) | `count_ops`, `labelled_step`, `op_class` |
| measure | `optime` | 04 (05) | `time_ops`, `per_call_overhead`, `busy_time`, `cuda_graphed` |
| measure | `regimes` | 04 (05) | `profile_step`, `check_regimes`, `fusion_report`, `why_it_paid` |
| measure | `predictions` | 04 | `blank_predictions`, `effect`, `score_predictions` |
| measure | `agreement` | 08 | `agree`, `optimizer_step_agreement`, `TOLERANCES` |
| model/data | `attention` | 01 | `naive_attention`, `tiled_attention`, `sdpa_attention` |
| model/data | `kernels` | 01 | `flash_attention` (Triton) |
| model/data | `models` | 01-06, 08 | `SmallTransformer`, `TransformerConfig`, `load_bert` |
| model/data | `corpus` | 06, 08 | `read_bundled_corpus`, `read_csv_corpus`, `read_hub`, `corpus_lengths` |
| model/data | `data` | 06, 08 | `load_text_classification`, `tokenize`, `PadCollate`, `make_dataloader` |
| model/data | `packing` | 06, 08 | `PackCollate`, `PackedBatchSampler`, `document_mask` |
| model/data | `packed_model` | 06, 08 | `PackedModel`, `base_model`, `packed_forward` |
| model/data | `fp8` | 08 | `fp8_supported`, `convert_to_float8`, `FP8Linear` |
| model/data | `synthetic` | 02-05 | `synthetic_batch_fn` |
| train | `checkpoint` | 03, 07, 08 | `save_checkpoint`, `load_checkpoint`, `save_sharded`, `load_sharded` |
| train | `runspec` | 02-08 | `RunSpec`, `PADDINGS`, `ATTNS` |
| train | `meter` | 02-08 | `Meter`, `TrainResult` |
| train | `train` | 02-08 | `TrainConfig`, `train`, `train_step`, `make_optimizer` |
| train | `evaluation` | 08 | `evaluate` |
| train | `distributed` | 07 | `setup`, `apply_ddp`, `apply_fsdp`, `launch` |
| train | `ladder` | 08 | `RUNGS`, `climb_stacks`, `keeps` |
| train | `ladder_report` | 08 | `ladder_rows`, `ladder_table`, `explain` |
| show | `plots` | all | `bar_chart`, `roofline_chart`, `attention_map_chart`, `memory_timeline_chart` |
| show | `widgets` | 01, 03 | `AttentionExplorer` |
| show | `exercises` | 00-08 | `check`, `show_solution`, `EXERCISES` |
| train | `plan` | 09 | `plan` |
| show | `lessons` | 00-09 | `LessonSetup`, `LESSON_MODULES` (lesson00.setup ... lesson09.setup) |
| show | `scripts` | 07, 08 | train_ddp.py, finetune_bert.py, exercise_ddp.py (run by torchrun) |

Imports run one way, down the table: a module imports modules of its own layer or of the layers above
it, never of a layer below (`LAYERS`; a test reads every import, function-level ones included).
"""

from __future__ import annotations

import importlib
from typing import Any

# module -> layer: 0 base, 1 measure, 2 model/data, 3 train, 4 show
LAYERS = {
    "config": 0, "compat": 0, "tables": 0, "timing": 0, "precision": 0, "device": 0, "diagnosis": 0,
    "verdicts": 0,
    "sizing": 0, "paths": 0, "adapt": 0, "nbrun": 0,
    "roofline": 1, "gpus": 1, "flops": 1, "memory": 1, "results": 1, "opcount": 1, "optime": 1, "regimes": 1,
    "predictions": 1, "agreement": 1,
    "attention": 2, "kernels": 2, "models": 2, "corpus": 2, "data": 2, "packing": 2, "packed_model": 2,
    "fp8": 2, "synthetic": 2,
    "checkpoint": 3, "runspec": 3, "meter": 3, "train": 3, "evaluation": 3, "distributed": 3, "ladder": 3,
    "ladder_report": 3, "plan": 3,
    "plots": 4, "widgets": 4, "exercises": 4, "lessons": 4, "scripts": 4,
}
_SUBMODULES = tuple(LAYERS)
# Shortcuts re-exported at the top level: name -> module that defines it.
_SHORTCUTS = {
    "device_report": "device",
    "get_device": "device",
    "get_profile": "config",
    "benchmark": "timing",
}

__all__ = [*_SUBMODULES, *_SHORTCUTS, "LAYERS"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _SHORTCUTS:
        return getattr(importlib.import_module(f"{__name__}.{_SHORTCUTS[name]}"), name)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
