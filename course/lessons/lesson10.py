"""Lesson 10's set-up (`10_make_it_fit`) and plumbing: what it plans at which size, the small Llama whose
levers it measures on this machine, the FSDP2 launch, and the summary table."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from course import paths
from course.lessons import LessonSetup
from course.profile import get_profile, pick
from course.scripts.fsdp_levers import ROWS, SEQ, batch, small_llama
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, AtMost, MeasuredTable, Range
from helpers.core.device import get_device
from helpers.core.tables import Table
from helpers.core.units import MiB
from helpers.measure.memory import estimate_step_memory
from helpers.train.distributed import launch

__all__ = ["SIZES", "setup", "measure_fsdp", "lever_table", "summary_table"]


SIZES = {"LEVER_ROWS": Size(full=ROWS, smoke=ROWS)}  # sequences per micro-batch of the small Llama measured


def _small_llama_step(sizes: Mapping[str, int]) -> int:
    """The small Llama's step peak at `sizes` (its shapes on the meta device: nothing allocated)."""
    with torch.device("meta"):
        shape = small_llama()
    return estimate_step_memory(shape, batch(rows=sizes["LEVER_ROWS"])).peak


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 10's sizes; prints what it plans and measures (lesson 10). Planning allocates nothing anywhere;
    the levers are measured on a Llama of 2 layers and 128 wide, on the CPU, whatever the device."""
    profile = get_profile(profile)
    device = get_device()
    gpus = pick(profile, smoke=["T4", "8xH100"], full=["T4", "L4", "A100-80", "8xH100"])
    seq, global_batch = pick(profile, smoke=512, full=1024), pick(profile, smoke=16, full=32)
    fit = fit_sizes(SIZES, {"the small Llama's step, measured on the CPU": _small_llama_step},
                    shrink=["LEVER_ROWS"], profile=profile, device=device, precision="fp32",
                    notes=[f"plans qwen2.5-0.5b at {global_batch} x {seq} tokens on {', '.join(gpus)} "
                           "(nothing allocated)", f"measures each lever on a 2-layer Llama, {SEQ} tokens a "
                           "sequence, on the CPU whatever the device"])
    s = LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, **fit.sizes,
        # the model a free T4 cannot train as it is: Qwen2.5-0.5B's shape (its config; nothing downloaded)
        MODEL="qwen2.5-0.5b", SEQ=seq,
        GLOBAL_BATCH=global_batch,  # sequences per optimizer step
        GPUS=gpus,
        BIG_MODEL="llama-2-7b", BIG_GPUS=["A100-80", "8xH100"],
        PLAN_BIG=profile != "smoke",  # a 7B plan takes a minute here: the full profile only
        FSDP_PROCESSES=2,
    )
    print(fit.line())
    return s


def measure_fsdp(processes: int) -> list[dict[str, Any]]:
    """Each rank's numbers from course/scripts/fsdp_levers.py under torchrun (`processes` CPU processes on
    gloo): the peak of its second step, sharded and then offloaded, and what it keeps (lesson 10)."""
    with tempfile.TemporaryDirectory(prefix="lesson10-") as out:
        launch(paths.script("fsdp_levers"), ["--out", out], nproc_per_node=processes,
               env={"OMP_NUM_THREADS": "1"}, timeout_s=600, echo=False)
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(processes)]


def lever_table(rows: Mapping[str, tuple[int, int]]) -> Table:
    """Each lever's dry run beside the peak measured here, in MiB, and how far apart they are (lesson 10)."""
    t = Table(["lever", "dry run (MiB)", "measured (MiB)", "dry run / measured"],
              title="Each lever on a 2-layer Llama, this CPU: the dry run against the step's measured peak")
    for name, (dry, measured) in rows.items():
        t.add(name, dry / MiB, measured / MiB, dry / measured)
    return t


def summary_table(*, plain: int, levers: Mapping[str, tuple[int, int]], lora_trainable: float,
                  fit_seconds: Sequence[float], accumulation_cost: float,
                  checkpointing_cost: float) -> MeasuredTable:
    """What we measured on this machine, next to the claims commonly made (lesson 10)."""
    t = MeasuredTable("What we measured on this machine (a 2-layer Llama on the CPU; plans of GPUs)")
    worst = max(abs(d / m - 1) for d, m in levers.values())
    t.add("largest gap, dry run vs measured peak, over the levers", round(worst, 3),
          "each lever's memory can be known before a GPU is rented (within 10 %)", rule=AtMost(0.10))
    _, accumulated = levers["accumulation x4"]
    t.add("accumulation x4: peak / the plain step's", round(accumulated / plain, 2),
          "accumulation keeps the gradients beside the next micro-batch's activations", rule=AtLeast(1.0))
    t.add("LoRA r=8: trainable share of the parameters", round(lora_trainable, 4),
          "LoRA trains a small fraction of the weights (under 5 %)", rule=AtMost(0.05))
    t.add("accumulation to micro-batch 1 on a T4: extra step time (planned)", round(accumulation_cost, 3),
          "accumulation costs little time while the GPU stays busy (under 50 %)", rule=AtMost(0.5))
    t.add("checkpointing on a T4: extra step time (planned)", round(checkpointing_cost, 3),
          "checkpointing costs about one more forward: a third more compute",
          rule=Range(0.1, 0.5, better=None))
    t.add("seconds to plan every lever on every class (this CPU)", round(max(fit_seconds), 1),
          "a plan takes a CPU and seconds, not a GPU (under 2 minutes)", rule=AtMost(120.0))
    return t


def one_thread() -> int:
    """One thread for the measurements (on a busy 2-core machine two threads ran ten times slower); returns
    the number before, to set back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return before
