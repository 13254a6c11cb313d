"""Lesson 06 (`06_input_pipeline`): its set-up (the batch of articles, fitted so that a fixed-length training
step fits the device, and how much of each experiment the profile runs), and the lesson's plumbing: the
training step every experiment shares, the DataLoader of each way of batching, the timed copies of the GPU
section, its checks (`check_...`, one line each in the lesson), tables and the summary."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.profile import get_profile, pick, small_config
from course.sizing import Size, fit_sizes
from course.verdicts import MeasuredTable
from helpers.core.device import get_device
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, benchmark, busy, synchronize
from helpers.data.packing import PackCollate, PackedBatchSampler
from helpers.data.text import PadCollate, TextExamples, TokenizedDataset
from helpers.measure.memory import estimate_training_memory
from helpers.model.models import SmallTransformer
from helpers.model.packed_model import PackedModel
from helpers.train.runspec import PADDINGS, RunSpec

__all__ = ["SIZES", "setup", "to_device", "pin_batch", "make_trainer", "worker_settings", "fastest_rounds",
           "workers_table", "time_copies", "check_syncs", "syncs_table", "check_padding_keeps_the_loss",
           "loader_for", "time_epochs", "padding_table", "check_padding_order", "headline_and_first_sentence",
           "short_texts", "sample", "check_trace", "summary_table"]

SIZES = {"BATCH": Size(full=32, smoke=8, floor=4)}  # articles per batch


def setup(profile: str | None = None, *, max_len: int = 512) -> LessonSetup:
    """Lesson 06's sizes on this device; prints what it chose and why (lesson 06)."""
    # Hugging Face tokenizers run their own threads; DataLoader workers are forked processes, and a fork after
    # those threads started can deadlock. Let the workers do the parallel work instead.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    profile = get_profile(profile)
    device = get_device()
    with torch.device("meta"):  # the model's shapes (BBC News has 5 classes), for the estimate
        shape = SmallTransformer(small_config(profile, n_classes=5, max_len=max_len))
    estimates = {  # a fixed-length batch is the largest; model0's weights stay beside the copy that trains
        "a training step on a copy of model0": lambda s: 4 * shape.num_params() + (
            estimate_training_memory(shape, s["BATCH"], max_len).peak)}
    fit = fit_sizes(SIZES, estimates, shrink=["BATCH"], profile=profile, device=device, precision="fp32")
    print(fit.line())
    p = fit.profile
    cores = os.cpu_count() or 1
    workers = pick(p, smoke=[0, 1, 2], full=[0, 2, 4, 8])  # num_workers to try
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, **fit.sizes, CORES=cores,
        # more worker processes than cores only adds switching
        WORKERS=[w for w in workers if w <= cores],
        LOADER_STEPS=pick(p, smoke=4, full=40),  # training steps timed per num_workers setting
        SYNC_STEPS=pick(p, smoke=3, full=30),  # steps of the .item() experiment
        PROFILE_STEPS=pick(p, smoke=3, full=10),  # steps recorded by torch.profiler
        TIMING_SPLIT=pick(p, smoke="val", full="train"),  # split whose epoch is timed for each padding
        TIMING_EXAMPLES=pick(p, smoke=64, full=None),  # a random sample of that split (None: all of it)
        ROUNDS=pick(p, smoke=2, full=3),  # worker sweep and epoch timings repeated; the fastest round counts
        COPY_MB=pick(p, smoke=16, full=256),  # size of the host->device copy (GPU only)
        LOAD=LoadProbe(children=True).start())  # what other programs take of the CPUs from here on: summary


# --- the training step every experiment shares --------------------------------------------------------------

Batch = Mapping[str, torch.Tensor]


def to_device(batch: Batch, device: torch.device, non_blocking: bool = False) -> dict[str, torch.Tensor]:
    """The batch's tensors on `device`; `non_blocking` queues each copy from pinned memory (lesson 06)."""
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def pin_batch(batch: Batch, gpu: bool) -> dict[str, torch.Tensor]:
    """Page-locked copies of a batch's tensors on a GPU machine (the batch itself elsewhere), for batches
    pinned ONCE and reused (lesson 06, section 4). Pinning batch after batch on the loop's thread, then
    copying, is usually slower than a plain .to(device) (section 3); DataLoader(pin_memory=True) pins in a
    thread of its own when it has workers."""
    return {k: v.pin_memory() for k, v in batch.items()} if gpu else dict(batch)


def make_trainer(model: torch.nn.Module, device: torch.device) -> Callable[..., torch.Tensor]:
    """-> train_step(batch, non_blocking=False): one forward, backward and AdamW update of `model`; returns
    the loss, still on the device. train_step.optimizer is the AdamW (lesson 06)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def train_step(batch: Batch, non_blocking: bool = False) -> torch.Tensor:
        loss = model(**to_device(batch, device, non_blocking)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    train_step.optimizer = opt  # for looking at its state
    return train_step


# --- section 2: workers -------------------------------------------------------------------------------------

def worker_settings(workers: Sequence[int], gpu: bool) -> list[tuple[int, bool]]:
    """The (num_workers, pin_memory) settings of the sweep: each of `workers`, unpinned; on a GPU also
    pin_memory=True with 0 workers (pinned inside next(), on the loop's thread) and with the most workers
    (pinned by the loader's pin-memory thread) (lesson 06, section 2)."""
    if not workers or workers[0] != 0:
        raise ValueError(f"workers must start with 0, the baseline of the sweep: got {list(workers)}")
    return [(w, False) for w in workers] + ([(0, True), (max(workers), True)] if gpu else [])


def fastest_rounds(fn: Callable[..., tuple[float, ...]], settings: Sequence[tuple], rounds: int,
                   ) -> dict[tuple, tuple[float, ...]]:
    """fn(*setting) for every setting, in `rounds` interleaved rounds; -> per setting the fastest round's
    result. Rounds interleave the settings so that a burst of other load hits all of them alike, and other
    programs only ever add time (lesson 06)."""
    runs: dict[tuple, list] = {s: [] for s in settings}
    for _ in range(rounds):
        for setting in settings:
            runs[setting].append(fn(*setting))
    return {s: min(results) for s, results in runs.items()}


def workers_table(runs: Mapping[tuple[int, bool], tuple[float, float]], S: LessonSetup) -> Table:
    """Per (num_workers, pin_memory): ms per step, ms waiting for data, that share, speed-up (lesson 06)."""
    table = Table(["num_workers", "pin_memory", "ms per step", "ms waiting for data", "waiting share",
                   "speed-up vs 0 workers"],
                  title=f"{S.LOADER_STEPS} training steps, batch {S.BATCH}, fastest of {S.ROUNDS} rounds")
    base = runs[(0, False)][0]
    for (w, pin), (step_s, wait_s) in runs.items():
        table.add(w, pin, step_s * 1e3, wait_s * 1e3, wait_s / step_s, base / step_s)
    return table


# --- section 3: copies to a GPU -----------------------------------------------------------------------------

def time_copies(copy_mb: int, device: torch.device) -> tuple[dict[str, float], Table]:
    """Three ways to copy `copy_mb` MB of float32 to `device`, each timed until the copy has arrived, and how
    long the CPU is blocked in the call: -> (numbers for the summary, a table) (lesson 06, section 3; GPU)."""
    n = copy_mb * 2**20 // 4  # float32 elements
    pageable = torch.randn(n)
    pinned_block = torch.randn(n).pin_memory()  # pinned once, reused by every copy below

    def arrived(t: torch.Tensor) -> torch.Tensor:
        # each arm is timed until its copy is on the device, not only until the copy is queued
        synchronize(device)
        return t

    arms = {
        "pageable: .to(device)": lambda: arrived(pageable.to(device)),
        "pin_memory() each time, then non_blocking": lambda: arrived(
            pageable.pin_memory().to(device, non_blocking=True)),
        "pinned once, non_blocking": lambda: arrived(pinned_block.to(device, non_blocking=True)),
    }
    copy_s = {name: benchmark(fn, name=name, min_run_time=0.5).median_s for name, fn in arms.items()}
    assert torch.equal(pinned_block.to(device).cpu(), pinned_block), "the pinned copy changed the data"
    # how long the CPU is blocked in the call itself (no synchronisation: that is the point)
    blocked = {}
    for name, src, nb in (("pageable", pageable, False), ("pinned once, non_blocking", pinned_block, True)):
        synchronize(device)
        t0 = time.perf_counter()
        src.to(device, non_blocking=nb)
        blocked[name] = time.perf_counter() - t0
        synchronize(device)
    out = {"pageable GB/s": n * 4 / copy_s["pageable: .to(device)"] / 1e9,
           "pin each time GB/s": n * 4 / copy_s["pin_memory() each time, then non_blocking"] / 1e9,
           "pinned GB/s": n * 4 / copy_s["pinned once, non_blocking"] / 1e9,
           "pinned blocked ms": blocked["pinned once, non_blocking"] * 1e3,
           "pageable blocked ms": blocked["pageable"] * 1e3}
    table = Table([f"copy of {copy_mb} MB", "ms until arrived", "GB/s"], title="host-to-device copies")
    for name, s in copy_s.items():
        table.add(name, s * 1e3, n * 4 / s / 1e9)
    slower = copy_s["pin_memory() each time, then non_blocking"] / copy_s["pageable: .to(device)"]
    print(f"pinning on this thread, then copying: {slower:.2f}x the time of a plain .to(device); "
          f"CPU blocked in the call: {out['pageable blocked ms']:.2f} ms pageable, "
          f"{out['pinned blocked ms']:.2f} ms pinned once with non_blocking")
    return out, table


# --- section 4: hidden syncs --------------------------------------------------------------------------------

def _device_syncs(prof: Any) -> int:
    # CUDA runtime calls that block the CPU until the GPU is done (none exist on a CPU)
    return sum(e.count for e in prof.key_averages() if "Synchronize" in e.key)


def _scalar_reads(prof: Any) -> int:
    # aten::_local_scalar_dense: the op behind every .item()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


def check_syncs(results: Mapping[str, tuple], batches: Sequence[Batch], S: LessonSetup) -> dict[str, Any]:
    """The two loops of section 4, {name: (losses, the optimizer, profile, seconds)}, the `.item()` loop
    first: the same losses; at least one `.item()` per step gone; AdamW's step counters on the CPU (their
    reads are CPU-to-CPU, no sync); on a GPU one device sync per step gone; the batches pinned on a GPU.
    AssertionError naming what failed; -> the numbers for the table and the summary (lesson 06, section 4)."""
    gpu = S.DEVICE.type == "cuda"
    pinned = all(t.is_pinned() for b in batches for t in b.values())
    assert not gpu or pinned, "a batch of the loops is not pinned"
    (a, opt_a, prof_a, s_a), (b, _, prof_b, s_b) = results.values()
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"the two loops ran different steps: their losses differ: {m}")
    n_a, n_b = _scalar_reads(prof_a), _scalar_reads(prof_b)
    assert n_a - n_b >= S.SYNC_STEPS, (
        f"the .item() loop made {n_a} scalar reads, the other {n_b}: not one hidden sync per step removed")
    steps_on = {s["step"].device.type for s in opt_a.state.values() if torch.is_tensor(s.get("step"))}
    assert steps_on == {"cpu"}, f"AdamW's step counters live on {steps_on}, not on the CPU"
    y_a, y_b = _device_syncs(prof_a), _device_syncs(prof_b)
    if gpu:  # the real waits: one per .item(), almost none without (the final read, the timing's syncs)
        assert y_a - y_b >= S.SYNC_STEPS - 1, f"device syncs: {y_a} with .item(), {y_b} without"
    print(f"checked: same losses; {(n_a - n_b) / S.SYNC_STEPS:.0f} scalar read per step removed; "
          f"{n_b / S.SYNC_STEPS:.0f} per step left in both, AdamW's step counters, which live on "
          f"{', '.join(steps_on)}" + (f"; device syncs {y_a} with .item(), {y_b} without" if gpu else ""))
    return {"items per step": (n_a - n_b) / S.SYNC_STEPS, "syncs": (y_a, y_b), "sync time ratio": s_a / s_b,
            "rows": {name: (_scalar_reads(p), _device_syncs(p), s) for name, (_, _, p, s) in results.items()}}


def syncs_table(found: Mapping[str, Any], S: LessonSetup) -> Table:
    """Per loop: scalar reads, device syncs, ms per step (lesson 06, section 4)."""
    table = Table(["loop", "_local_scalar_dense calls", "device synchronisations", "ms per step (profiled)"],
                  title=f"{S.SYNC_STEPS} steps, same losses, pinned batches copied with non_blocking=True "
                        "in both")
    for name, (n, y, s) in found["rows"].items():
        table.add(name, n, y if S.DEVICE.type == "cuda" else "– (CPU)", s / S.SYNC_STEPS * 1e3)
    return table


# --- section 5: padding and packing -------------------------------------------------------------------------

def check_padding_keeps_the_loss(model: torch.nn.Module, ds: TokenizedDataset, pad_id: int, S: LessonSetup,
                                 max_len: int) -> None:
    """The same articles give the same loss padded to max_len, padded dynamically, and packed several to a
    row (the shortest articles, so that a mask leaking between them would show): AssertionError otherwise
    (lesson 06, section 5)."""
    probe = [ds[i] for i in range(S.BATCH)]
    shortest = sorted(range(len(ds)), key=lambda i: ds.lengths[i])[:S.BATCH]
    short_probe = [ds[i] for i in shortest]
    packed = PackCollate(max_len, pad_id)(short_probe)
    assert packed["input_ids"].shape[0] < len(short_probe), "the probe should put several articles in a row"
    was_training = model.training
    model.eval()
    with torch.no_grad():
        fixed = model(**to_device(PadCollate(pad_id, fixed_length=max_len)(probe), S.DEVICE)).loss
        dynamic = model(**to_device(PadCollate(pad_id)(probe), S.DEVICE)).loss
        short_padded = model(**to_device(PadCollate(pad_id)(short_probe), S.DEVICE)).loss
        short_packed = PackedModel(model)(**to_device(packed, S.DEVICE)).loss
    model.train(was_training)
    torch.testing.assert_close(fixed, dynamic, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"fixed and dynamic padding give different losses: {m}")
    torch.testing.assert_close(short_packed, short_padded, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"packed and padded articles give different losses: {m}")
    print(f"checked: the same loss with fixed and dynamic padding ({fixed.item():.5f} vs "
          f"{dynamic.item():.5f}), "
          f"and padded and packed, {len(short_probe)} articles in {packed['input_ids'].shape[0]} rows "
          f"({short_padded.item():.5f} vs {short_packed.item():.5f})")


def loader_for(ds: TokenizedDataset, padding: str, S: LessonSetup, pad_id: int, max_len: int,
               seed: int = 0) -> DataLoader:
    """The DataLoader of one way of batching (PADDINGS), pinned on a GPU in every arm so that their copies to
    the device are the same kind of copy (no workers: pinned inside next(), on this thread; section 3)
    (lesson 06, section 5)."""
    if padding != "packed":
        return RunSpec(padding=padding).dataloader(ds, S.BATCH, pad_token_id=pad_id, max_length=max_len,
                                                   seed=seed, device=S.DEVICE)
    # rows of max_len tokens; per batch, enough rows that an epoch takes (at most) as many steps as padded
    # batches of BATCH documents do, so every way of batching makes about the same optimizer steps
    n_rows = len(PackedBatchSampler(ds.lengths, seq_len=max_len, rows_per_batch=1, seed=seed))
    steps = -(-len(ds) // S.BATCH)  # ceil: the padded loaders' batches per epoch
    sampler = PackedBatchSampler(ds.lengths, seq_len=max_len, rows_per_batch=-(-n_rows // steps), seed=seed)
    collate = PackCollate(max_len, pad_id, strategy="sequential")
    return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, pin_memory=S.DEVICE.type == "cuda")


def time_epochs(model0: torch.nn.Module, ds: TokenizedDataset, S: LessonSetup, pad_id: int, max_len: int,
                seed: int = 0) -> tuple[dict[str, tuple[float, list]], float]:
    """One epoch over `ds` per way of batching, training a copy of model0, in S.ROUNDS interleaved rounds ->
    ({padding: (fastest seconds, its batches)}, the largest spread between rounds of one way) (lesson 06)."""
    batches = {p: list(loader_for(ds, p, S, pad_id, max_len, seed)) for p in PADDINGS}  # collated up front

    def epoch(p: str) -> float:
        model = copy.deepcopy(model0)
        train_step = make_trainer(PackedModel(model) if p == "packed" else model, S.DEVICE)
        train_step(batches[p][0])  # warm-up, not timed
        synchronize(S.DEVICE)
        t0 = time.perf_counter()
        for batch in batches[p]:
            train_step(batch)
        synchronize(S.DEVICE)
        return time.perf_counter() - t0

    epoch_s: dict[str, list[float]] = {p: [] for p in PADDINGS}
    for _ in range(S.ROUNDS):  # interleaved rounds: a burst of other load hits all the variants alike
        for p in PADDINGS:
            epoch_s[p].append(epoch(p))
    spread = max(max(v) / min(v) - 1 for v in epoch_s.values())  # same work, different times: noise
    return {p: (min(epoch_s[p]), batches[p]) for p in PADDINGS}, spread


def padding_table(name: str, padding: Mapping[str, float], timed: Mapping[str, tuple[float, list]],
                  title: str, measured: dict[str, Any]) -> Table:
    """Per way of batching: its padding share (`padding`, over the train split, as section 5's cell computes
    it), tokens computed, real tokens, steps, epoch time, real tokens/s, speed-up; fills
    measured[f"{name} ..."] (lesson 06, section 5)."""
    table = Table(["batching", "padding (train split)", "tokens computed", "real tokens", "steps", "epoch s",
                   "real tokens/s", "speed-up vs fixed"], title=title)
    fixed_s = timed["fixed"][0]
    for p, (seconds, bs) in timed.items():
        computed = sum(b["input_ids"].numel() for b in bs)
        real = sum(int(b["attention_mask"].sum()) for b in bs)
        measured[f"{name} padding {p}"] = padding[p]
        measured[f"{name} epoch {p} s"], measured[f"{name} tokens {p}"] = seconds, computed
        measured[f"{name} real tokens/s {p}"] = real / seconds
        table.add(p, measured[f"{name} padding {p}"], computed, real, len(bs), seconds, real / seconds,
                  fixed_s / seconds)
    return table


def check_padding_order(measured: Mapping[str, Any], name: str, bucketing: bool = True) -> None:
    """Padding shares in the order the ways of batching promise: fixed ≥ dynamic (≥ bucketed, with
    `bucketing`), and packed below dynamic: AssertionError otherwise (lesson 06, section 5)."""
    pad = {p: measured[f"{name} padding {p}"] for p in PADDINGS}
    assert pad["fixed"] >= pad["dynamic"], f"{name}: dynamic padding left more padding than fixed: {pad}"
    assert not bucketing or pad["dynamic"] >= pad["bucketed"], f"{name}: bucketing added padding: {pad}"
    assert pad["packed"] < pad["dynamic"], f"{name}: packing must leave less padding than dynamic: {pad}"
    print(f"checked ({name}): padding " + ", ".join(f"{p} {v:.0%}" for p, v in pad.items()))


def headline_and_first_sentence(text: str) -> str:
    """A BBC article's headline and its first sentence (lesson 06, section 5)."""
    title, _, body = text.partition("\n\n")
    first = re.split(r"(?<=[.!?])\s", body.strip(), maxsplit=1)[0]  # up to the first sentence's end
    return f"{title}. {first}"


def short_texts(examples: TextExamples) -> TextExamples:
    """The same examples, each cut to its headline and first sentence (lesson 06, section 5)."""
    return type(examples)([headline_and_first_sentence(t) for t in examples.texts], list(examples.labels))


def sample(examples: TextExamples, n: int | None, seed: int = 0) -> TextExamples:
    """A random sample of n examples (all of them when n is None or larger) (lesson 06, section 5)."""
    if n is None or n >= len(examples):
        return examples
    keep = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))[:n].tolist()
    return type(examples)([examples.texts[i] for i in keep], [examples.labels[i] for i in keep])


# --- section 6: the profile ---------------------------------------------------------------------------------

def check_trace(path: Path, labels: Iterable[str] = ("forward",)) -> None:
    """The exported trace holds the step's labels: AssertionError otherwise; prints where it is
    (lesson 06, section 6)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    missing = [label for label in labels if label not in names]
    assert not missing, f"the trace {path} lacks the labels {missing}"
    print(f"checked: the trace holds our labels; {path} ({Path(path).stat().st_size / 1e6:.1f} MB, "
          f"{len(events)} events): open it at https://ui.perfetto.dev")


def summary_table(measured: Mapping[str, Any], S: LessonSetup) -> MeasuredTable:
    """This run's numbers next to claims C10 and C12, with verdicts; the timed ones "too busy to judge" where
    other programs took the CPUs while the lesson ran (S.LOAD, helpers.core.timing.busy's rule; its DataLoader
    workers count as its own) (lesson 06, "What we measured")."""
    gpu = S.DEVICE.type == "cuda"
    probe = getattr(S, "LOAD", None)
    load = probe.read() if probe is not None else None
    state = busy(load=load)
    workers = measured["workers"]
    w0 = workers[(0, False)]
    best_w, _ = min(((w, s) for (w, pin), s in workers.items() if not pin), key=lambda x: x[1])
    with_workers = min((s for (w, pin), s in workers.items() if w and not pin), default=None)
    summary = MeasuredTable(f"Lesson 06 on {S.DEVICE} ({S.PROFILE} profile, {S.CORES} cores)")
    summary.add("building one batch (tokenise + pad), ms", measured["batch build s"] * 1e3)
    summary.add(f"fastest num_workers (of {S.WORKERS})", best_w)
    summary.add("step time, 0 workers / the fastest with workers",
                w0 / with_workers if with_workers else None, CLAIMS["workers-needed"],
                needs="num_workers > 0 in WORKERS", busy=state)
    summary.add("most workers could gain: 1 / (1 - share of time waiting with 0)",
                1 / (1 - measured["wait share 0"]))
    if gpu:
        most = max(S.WORKERS)
        pinned_0, pinned_w = workers[(0, True)], workers[(most, True)]
        summary.add("step time, pin_memory=True / False, 0 workers (pinned on this thread)", pinned_0 / w0)
        summary.add(f"step time, pin_memory=True, {most} workers (pin thread) / 0 workers",
                    pinned_w / pinned_0)
        summary.add(f"synthetic {S.COPY_MB} MB copy, GB/s: pageable / pin each time / pinned once",
                    f"{measured['pageable GB/s']:.1f} / {measured['pin each time GB/s']:.1f} / "
                    f"{measured['pinned GB/s']:.1f}")
        summary.add("CPU blocked by that copy, ms: pageable / pinned once, non_blocking",
                    f"{measured['pageable blocked ms']:.2f} / {measured['pinned blocked ms']:.2f}")
    summary.add("the real batch's copy, share of a measured step", measured["copy share"] if gpu else None,
                CLAIMS["copies-throttle"],
                needs="a GPU (no copy on a CPU)", busy=state)
    summary.add(".item() calls per step, removed", measured["items per step"])
    summary.add("time with .item() every step / without", measured["sync time ratio"])
    if gpu:
        summary.add("device synchronisations: with .item() / without", "%d / %d" % measured["syncs"])
    for p in PADDINGS:
        summary.add(f"padding share, {p} batches", measured[f"articles padding {p}"])
    for a, b in (("fixed", "dynamic"), ("fixed", "bucketed"), ("dynamic", "bucketed")):
        summary.add(f"epoch time {a} / {b}",
                    measured[f"articles epoch {a} s"] / measured[f"articles epoch {b} s"])
    for name in ("articles", "short"):
        gain = measured[f"{name} real tokens/s packed"] / measured[f"{name} real tokens/s dynamic"]
        pad = measured[f"{name} padding dynamic"]  # the claim needs >= 30 % padding to remove: 1.5x possible
        summary.add(f"{name}: real tokens/s packed / dynamic (padding {pad:.0%}, bound {1 / (1 - pad):.2f}x)",
                    gain, CLAIMS["packing-gain"],
                    busy=busy(measured[f"{name} round spread"], load=load), testable=pad >= 0.30,
                    needs=f"data with ≥ 30 % padding (this has {pad:.0%})")
    spread = measured["articles round spread"]
    summary.add("largest spread between rounds of the same epoch (noise)", spread)
    saved = 1 - measured["articles tokens bucketed"] / measured["articles tokens fixed"]
    ratio = measured["articles epoch fixed s"] / measured["articles epoch bucketed s"]
    timed = busy(spread, load=load)
    if timed.too_busy:
        print(f"padding: bucketing computed {saved:.0%} fewer tokens than fixed-length padding; its epoch "
              f"time: {timed}")
    else:
        print(f"padding: bucketing computed {saved:.0%} fewer tokens than fixed-length padding, and the "
              f"epoch was {ratio:.2f}x {'faster' if ratio > 1 else 'SLOWER'} (the token count alone would "
              f"give {1 / (1 - saved):.2f}x; rounds of one variant differed by up to {spread:.0%})")
    return summary
