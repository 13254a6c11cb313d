"""Making a run fit (helpers/plan: extrapolate, steptime, fit; lesson 10): the deep step from shallow copies,
the step's time with the levers, memory per GPU with the levers, and the choice with its reason. Small models
on fake tensors: no test allocates more than a few MB."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers.measure.gpus import gpu
from helpers.measure.levers import AdamW8bitState, Levers, optimizer_state_bytes
from helpers.measure.memory import estimate_step_memory
from helpers.measure.opcount import OPTIMIZER_PHASE, OpCount, count_step
from helpers.measure.roofline import Roofline, datasheet_roofline
from helpers.model.models import TransformerConfig
from helpers.plan.extrapolate import corners_of, counts_at, layers_of, memory_at, with_layers
from helpers.plan.fit import GpuMemory, Pricer, make_it_fit
from helpers.plan.planner import example_batch
from helpers.plan.steptime import communication, step_time

SEQ = 16


def _model(layers: int = 4) -> torch.nn.Module:
    with torch.device("meta"):
        return TransformerConfig(vocab_size=64, d_model=32, n_heads=2, n_layers=layers, max_len=SEQ).build()


# --- the deep step from shallow copies ----------------------------------------------------------------

def test_a_deep_step_is_its_shallow_copies_extrapolated():
    model = _model(5)
    assert layers_of(model) == 5 and layers_of(with_layers(model, 2)) == 2
    memory = corners_of(lambda m, r: estimate_step_memory(m, example_batch(m, r, SEQ)), model, (1, 2, 4))
    counts = corners_of(lambda m, r: count_step(m, example_batch(m, r, SEQ)), model, (1, 2))
    for rows in (1, 6):
        direct = estimate_step_memory(model, example_batch(model, rows, SEQ))
        guessed = memory_at(memory, 5, rows)
        assert guessed.parameters == direct.parameters and guessed.optimizer == direct.optimizer
        assert abs(guessed.peak - direct.peak) <= 0.02 * direct.peak, (rows, guessed.peak, direct.peak)
        exact = count_step(model, example_batch(model, rows, SEQ))
        assert sum(c.flops for c in counts_at(counts, 5, rows).values()) == pytest.approx(
            sum(c.flops for c in exact.values()))
    # planted: a corner measured at the wrong size shifts the extrapolation
    wrong = dict(memory)
    wrong[2, 4] = estimate_step_memory(with_layers(model, 2), example_batch(model, 8, SEQ))
    assert memory_at(wrong, 5, 6).peak > 1.05 * estimate_step_memory(model, example_batch(model, 6, SEQ)).peak


# --- the step's time with the levers ----------------------------------------------------------------

def _counts(fwd_bytes: float, opt_bytes: float, calls: int = 1) -> dict:
    adamw = "aten::_fused_adamw_"
    return {("forward", "aten::add"): OpCount("forward", "aten::add", calls, 0.0, fwd_bytes, 0.0, "none"),
            (OPTIMIZER_PHASE, adamw): OpCount(OPTIMIZER_PHASE, adamw, calls, 0.0, opt_bytes, 0.0, "none")}


def test_accumulation_repeats_the_micro_batch_and_steps_the_optimizer_once():
    roof = Roofline("gpu", {"bf16": 1e15, "fp32": 1e14}, 1e12, device_type="cuda", overhead_s=0.0)
    one = step_time(_counts(1e9, 5e8), roof, "bf16")
    four = step_time(_counts(1e9, 5e8), roof, "bf16", levers=Levers(accumulation=4))
    assert one.seconds == pytest.approx(1.5e-3) and four.seconds == pytest.approx(4.5e-3)


def test_a_gpu_step_is_the_longer_of_its_kernels_and_the_hosts_issue_time():
    roof = Roofline("gpu", {"bf16": 1e15, "fp32": 1e14}, 1e12, device_type="cuda", overhead_s=10e-6)
    kernels = step_time(_counts(1e9, 1e6, calls=10), roof, "bf16")  # 1 ms of kernels, 0.2 ms of launches
    host = step_time(_counts(1e6, 1e6, calls=1000), roof, "bf16")  # 2 us of kernels, 20 ms of launches
    assert kernels.bound == "kernels" and kernels.seconds == pytest.approx(1.001e-3)
    assert host.bound == "the host" and host.seconds == pytest.approx(2000 * 10e-6)
    cpu = replace(roof, synchronous=True)  # a CPU: each op's launches and work add
    assert step_time(_counts(1e9, 1e6, calls=10), cpu, "bf16").seconds == pytest.approx(1.001e-3 + 20 * 10e-6)


def test_collectives_move_the_bytes_of_a_ring_over_the_slowest_link():
    h100, n = gpu("8xH100"), 8
    ddp, link = communication(Levers(gpus=n), h100, trainable=10**9, parameters=10**9)
    assert link == "NVLink 4" and ddp == pytest.approx(2 * 7 / 8 * 4e9 / 450e9)
    fsdp, _ = communication(Levers(accumulation=2, gpus=n, sharding="full"), h100, trainable=10**9,
                            parameters=10**9)
    assert fsdp == pytest.approx(2 * (2 * 7 / 8 * 2e9 + 7 / 8 * 4e9) / 450e9)
    across, link = communication(Levers(gpus=16), gpu("8xH100").with_count(16), trainable=10**9,
                                 parameters=10**9)
    assert "InfiniBand" in link and across == pytest.approx(2 * 15 / 16 * 4e9 / 50e9)
    with pytest.raises(ValueError, match="needs gpus >= 2"):
        Levers(sharding="full")


# --- memory per GPU with the levers ----------------------------------------------------------------

def test_adam_state_in_8_bits_is_laid_out_as_bitsandbytes_keeps_it():
    with torch.device("meta"):
        big, small = torch.nn.Linear(256, 256, bias=True), torch.nn.Linear(16, 16, bias=False)
    model = torch.nn.Sequential(big, small)
    # a 65,536-element weight: two uint8 states and 256 fp32 absmax values each; the rest stay fp32 (< 4096)
    assert optimizer_state_bytes(model, "adamw8bit") == 2 * (65536 + 4 * 256) + 8 * 256 + 8 * 256
    assert optimizer_state_bytes(model, "adamw") == 8 * (65536 + 256 + 256)
    # the same bytes the dry run's stand-in for bitsandbytes holds (its two shared 256-value maps aside)
    real = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(16, 16, bias=False))
    for p in real.parameters():
        p.grad = torch.zeros_like(p)
    opt = AdamW8bitState(real.parameters())
    opt.step()
    held = sum(t.numel() * t.element_size() for st in opt.state.values() for k, t in st.items()
               if isinstance(t, torch.Tensor) and not k.startswith("qmap"))
    assert held == optimizer_state_bytes(real, "adamw8bit")


@pytest.fixture(scope="module")
def pricer():
    return Pricer(_model(4), SEQ)


def test_sharding_divides_what_it_shards_and_nothing_else(pricer):
    g = gpu("8xH100")
    plain = pricer.option(g, Levers(2, gpus=8)).memory
    zero1 = pricer.option(g, Levers(2, gpus=8, sharding="optimizer")).memory
    fsdp = pricer.option(g, Levers(2, gpus=8, sharding="full")).memory
    assert zero1.optimizer == plain.optimizer // 8 and zero1.weights == plain.weights
    assert fsdp.weights == plain.weights // 8 and fsdp.optimizer == plain.optimizer // 8 and fsdp.gathered > 0
    assert fsdp.gradients == plain.gradients // 8  # the shard; the reduce-scatter's buffer with the gathered
    assert fsdp.activations == plain.activations  # each GPU still runs its micro-batch whole
    offload = pricer.option(g, Levers(2, gpus=8, sharding="full", offload=True))
    assert offload.memory.optimizer == 0 and offload.memory.weights == 0 and offload.step.offload_s > 0


def test_checkpointing_and_accumulation_cut_activations_and_cost_time(pricer):
    g = gpu("T4")
    base = pricer.option(g, Levers(8))
    ckpt = pricer.option(g, Levers(8, checkpointing=True))
    accum = pricer.option(g, Levers(2, accumulation=4))
    assert ckpt.memory.activations < base.memory.activations and ckpt.step.kernels_s > base.step.kernels_s
    assert accum.memory.activations < base.memory.activations and accum.levers.global_batch == 8
    with pytest.raises(ValueError, match="1 GPU"):
        pricer.option(g, Levers(2, gpus=2))


def test_the_choice_fits_is_the_fastest_and_says_what_is_too_large(pricer):
    model = pricer.model
    one = pricer.option("T4", Levers(1)).memory
    # a T4 small enough that the whole batch does not fit but a micro-batch of 1 does; and one that holds
    # less than the weights and Adam's state: no accumulation or checkpointing can help there
    small = replace(gpu("T4"), key="small T4", total_memory=int(one.total / 0.8))
    tiny = replace(gpu("T4"), key="tiny T4", total_memory=int((one.weights + one.optimizer) / 0.9))
    allow = ("accumulation", "checkpointing")
    plan = make_it_fit(model, seq_len=SEQ, global_batch=16, gpus=[small, tiny], allow=allow, prices=None,
                       pricer=pricer)  # the fixture's dry runs and counts, reused
    pick, base = plan.chosen("small T4"), plan.baseline("small T4")
    assert not base.fits and pick.fits and pick.levers.global_batch == 16
    assert all(o.expected.seconds * 1.01 >= pick.expected.seconds for o in plan.of("small T4") if o.fits)
    why = plan.why("small T4")
    assert f"the largest part is {base.memory.largest()}" in why and "Chosen:" in why
    stuck = plan.why("tiny T4")
    assert plan.chosen("tiny T4") is None and "Nothing allowed (accumulation, checkpointing)" in stuck
    assert "sharding, offload, 8-bit state, 16-bit weights, LoRA would cut them" in stuck, stuck
    assert "accumulation" not in stuck.split("would cut")[0].split("it needs")[1]  # no lever that cannot help
    with pytest.raises(ValueError, match="unknown lever"):
        make_it_fit(model, seq_len=SEQ, global_batch=16, gpus=["T4"], allow=("magic",))
    with pytest.raises(ValueError, match="pricer was made for another model, seq_len"):
        make_it_fit(model, seq_len=2 * SEQ, global_batch=16, gpus=["T4"], pricer=pricer)


def test_gpu_memory_names_its_largest_part():
    assert GpuMemory(1, 2, 3, 10).largest() == "activations" and GpuMemory(9, 2, 3, 1).total == 15


def test_a_datasheet_roofline_prices_a_step():
    counts = count_step(_model(2), example_batch(_model(2), 2, SEQ), precision="bf16")
    t = step_time(counts, datasheet_roofline("A100-80"), "bf16")
    assert t.seconds > 0 and t.bound in ("kernels", "the host") and t.flops > 0


def test_the_planners_memory_per_gpu_agrees_with_the_levers_own_dry_run():
    """The planner prices levers from one pass's dry run and its terms (fast, for thousands of options);
    helpers.measure.memory.estimate_step_memory runs each lever itself (FSDP2 on a fake process group,
    accumulation's second pass, bitsandbytes' layout): the two agree within 5 % of the step's peak."""
    from helpers.measure.levers import LoRA
    from helpers.measure.memory import estimate_step_memory

    model = _model(3)
    pricer = Pricer(model, SEQ, lora_targets=("qkv", "proj"))
    batch = example_batch(model, 2, SEQ)
    cases = [(Levers(2, accumulation=2), dict(accumulation=2), "A100-80"),
             (Levers(2, checkpointing=True), dict(checkpointing=True), "A100-80"),
             (Levers(2, optimizer="adamw8bit"), dict(optimizer="adamw8bit"), "A100-80"),
             (Levers(2, lora_rank=8), dict(lora=LoRA(rank=8, alpha=16, targets=("qkv", "proj"))), "A100-80"),
             (Levers(2, gpus=2, sharding="full"), dict(shards=2), "2xA100-80"),
             (Levers(2, gpus=4, sharding="full", checkpointing=True), dict(shards=4, checkpointing=True),
              "4xA100-80"),
             (Levers(2, gpus=2, sharding="full", offload=True), dict(shards=2, offload=True), "2xA100-80")]
    for levers, kwargs, g in cases:
        planned = pricer.option(g, levers, precision="bf16").memory.total
        dry = estimate_step_memory(model, batch, precision="bf16", **kwargs).peak
        tolerance = 0.10 if levers.offload else 0.05
        assert abs(planned - dry) <= tolerance * dry and (planned >= dry or not levers.offload), (
            levers.describe(), planned, dry)


def test_a_deep_step_peaking_in_its_backward_is_not_taken_for_its_copies_optimizer_peak():
    """A step's peak is the larger of two moments, each linear in layers and sequences: the optimizer step's
    (weights and state: big for shallow copies with a large embedding) and the backward's (activations). At
    one sequence the 1- and 2-layer copies peak at their optimizer step, the whole model in its backward (as
    BERT-large's 24 layers at 1 x 512 do: 5.75 GiB where the 1-2-layer segment alone gave 5.00)."""
    from helpers.measure.memory import MemoryEstimate

    def optimizer_moment(layers, rows):
        return 1000 + 100 * layers  # the embedding's weights and state, plus each layer's

    def backward_moment(layers, rows):
        return 200 + 480 * layers * rows  # activations grow with layers x sequences

    def estimate(layers, rows):
        peak = max(optimizer_moment(layers, rows), backward_moment(layers, rows))
        return MemoryEstimate(0, 0, 0, 0, 0, 0, "fp32", rows, 8, method="dry run", dry_run_peak=peak)

    corners = {(n, r): estimate(n, r) for n in (1, 2) for r in (1, 2, 4)}
    assert optimizer_moment(2, 1) > backward_moment(2, 1)  # the copies peak at the optimizer step ...
    assert backward_moment(24, 1) > optimizer_moment(24, 1)  # ... the whole model in its backward
    for layers, rows in ((24, 1), (24, 3), (24, 8), (2, 1), (1, 2)):
        want = max(optimizer_moment(layers, rows), backward_moment(layers, rows))
        assert memory_at(corners, layers, rows).peak == want, (layers, rows)


def test_a_moment_with_gradients_alive_bounds_the_peak_above_the_corners():
    """With checkpointing, 1-2-layer copies of a large-vocabulary model peak late in the backward (all
    gradients alive) at 1-2 sequences and at the end of the forward from 4 on; the forward's line,
    extrapolated to a deep model, can fall below what the backward's moment holds. The larger counts (a
    7B Llama at 16 x 1024 once came out 90.9 GiB, under the 100.7 its weights, AdamW state and gradients
    hold)."""
    from helpers.measure.memory import MemoryEstimate

    def late_backward(layers, rows):
        return 3000 * layers + 10 * rows  # weights, state and every gradient: a layer's are large

    def forward_end(layers, rows):
        return 2300 * layers + 300 * rows  # checkpointed: a layer keeps its input only

    def estimate(layers, rows):
        late, fwd = late_backward(layers, rows), forward_end(layers, rows)
        at_peak = {"Gradient": 1000 * layers} if late >= fwd else {}
        return MemoryEstimate(0, 0, 0, 0, 0, 0, "fp32", rows, 8, method="dry run",
                              dry_run_peak=max(late, fwd), at_peak=at_peak)

    corners = {(n, r): estimate(n, r) for n in (1, 2) for r in (1, 2, 4, 8, 16)}
    assert corners[2, 2].at_peak and not corners[2, 16].at_peak  # the corners show both moments
    for layers, rows in ((32, 16), (32, 24), (32, 4)):
        want = max(late_backward(layers, rows), forward_end(layers, rows))
        assert memory_at(corners, layers, rows).peak == want, (layers, rows)
    # planted: the rule before, the top segment alone above the corners, misses the backward's moment
    from helpers.plan.extrapolate import _segment

    assert _segment(corners, 8, 16, 32, 24).peak < late_backward(32, 24)
