"""The tools of lesson 04, read together: helpers.measure.opcount's counts agree with independent ones (hand
formulas, tensor sizes, the rows an index op reads), helpers.measure.optime times the counted ops beside plain
steps and prices the profiler's events, helpers.measure.regimes' checks fail on planted errors (an op above
its roof, a profile that does not account for the step, an op missing from the profile), its split of each
op's time adds up, and
course.predictions refuses a late prediction and scores "helped most"."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import helpers.measure.opcount as opcount
from course.predictions import (
    OP_KINDS,
    Effect,
    blank_predictions,
    effect,
    lock_predictions,
    not_measured,
    score_predictions,
    start_measuring,
)
from course.profile import small_config
from helpers.core.timing import Timing
from helpers.data.synthetic import synthetic_batch_fn
from helpers.measure.flops import model_flops_per_token
from helpers.measure.opcount import count_ops, is_communication, labelled_step, op_class
from helpers.measure.optime import OpTimes, busy_time, cuda_graphed, per_call_overhead, time_ops
from helpers.measure.regimes import (
    EXCESS,
    REGIMES,
    TOO_BUSY,
    OpTable,
    amdahl_bound,
    check_flops,
    check_reconciled,
    check_regimes,
    check_roofs,
    classify_regime,
    fixed_work_s,
    fusion_report,
    is_synchronous,
    op_table,
    predicted_time,
    profile_step,
    why_it_paid,
)
from helpers.measure.roofline import Roofline
from helpers.model.models import SmallTransformer
from helpers.train.loop import make_optimizer

# A made-up machine: 100 GFLOP/s, 10 GB/s (ridge at 10 FLOP/byte), 5 µs per call.
ROOF = Roofline("test machine", {"fp32": 100e9}, 10e9, 512, 2**20)
OVERHEAD_S = 5e-6


def one_op(fn):
    """A step(phase) that runs `fn` in the phase "forward"."""
    def step(phase):
        with phase("forward"):
            fn()
    return step


def table_of(step, roof=ROOF, overhead_s=OVERHEAD_S):
    counts = count_ops(step, warmup=0)
    times = time_ops(step, steps=1, warmup=0, counted=counts)
    return op_table(counts, times, roof, overhead_s=overhead_s)


# --- counts agree with independent ones -------------------------------------------------------------------

def test_matmul_flops_and_bytes_are_the_hand_counts():
    m, k, n = 64, 32, 48
    a, b = torch.randn(m, k), torch.randn(k, n)
    counts = count_ops(one_op(lambda: a @ b), warmup=0)
    c = counts[("forward", "aten::mm")]
    assert c.calls == 1 and c.flops == 2 * m * k * n and c.flops_source == "FlopCounterMode"
    assert c.bytes == 4 * (m * k + k * n + m * n)  # A and B read once, C written once


def test_elementwise_bytes_are_the_tensor_sizes():
    x = torch.randn(8, 256)
    counts = count_ops(one_op(lambda: F.gelu(x)), warmup=0)
    c = counts[("forward", "aten::gelu")]
    assert c.bytes_read == x.nbytes and c.bytes_written == x.nbytes  # read x, write an x-sized output
    assert c.flops == x.numel() and c.flops_source == "1 per element written"


def test_in_place_broadcast_and_view_traffic():
    x, bias = torch.randn(16, 32), torch.randn(32)
    counts = count_ops(one_op(lambda: (x.add_(bias), x.t())), warmup=0)
    add = counts[("forward", "aten::add_")]
    assert add.bytes_read == x.nbytes + bias.nbytes and add.bytes_written == x.nbytes  # bias stored once
    view = counts[("forward", "aten::t")]
    assert view.is_view and view.bytes == 0 and view.flops == 0


def test_write_only_ops_do_not_read_their_destination():
    x = torch.empty(1000)
    c = count_ops(one_op(lambda: x.fill_(1.0)), warmup=0)[("forward", "aten::fill_")]
    assert c.bytes_read == 0 and c.bytes_written == x.nbytes and c.flops == 0


def _fused_adamw_counts(grad_scale):
    """The bytes count_ops charges one fused AdamW step of a 1000 x 100 weight, with a grad scale or not."""
    p = torch.nn.Parameter(torch.randn(1000, 100))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    opt.step()  # its state: two moments and a step counter per weight
    st = opt.state[p]

    def step():
        torch._fused_adamw_([p], [p.grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [st["step"]], lr=1e-3,
                            beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
                            maximize=False, grad_scale=grad_scale)
    return p.nbytes, count_ops(one_op(step), warmup=0)[("forward", "aten::_fused_adamw_")]


def test_fused_adamw_reads_four_numbers_per_weight_and_writes_three():
    """Issue 50 (lesson 04: "AdamW reads four numbers per parameter and writes three"): the kernel stores the
    gradient back only when it unscales it (fused_adam_utils.cuh: `if (grad_scale_ptr)`), so without a grad
    scale the gradient is read, not written; with one, it is written too."""
    size, c = _fused_adamw_counts(None)
    step_counter = 4  # the float32 step count, read
    assert c.bytes_read == 4 * size + step_counter and c.bytes_written == 3 * size
    size, scaled = _fused_adamw_counts(torch.tensor(2.0))
    assert scaled.bytes_written == 4 * size  # the unscaled gradient stored back


def test_index_ops_are_charged_for_what_they_touch():
    table, idx = torch.randn(1000, 16), torch.tensor([3, 3, 7, 9, 3])  # 3 distinct rows of a 1000-row table
    c = count_ops(one_op(lambda: F.embedding(idx, table)), warmup=0)[("forward", "aten::embedding")]
    assert c.bytes_read == idx.nbytes + 3 * 16 * 4 and c.bytes_written == 5 * 16 * 4  # not the whole table
    logp, target = torch.randn(8, 500).log_softmax(-1), torch.randint(0, 500, (8,))
    c = count_ops(one_op(lambda: F.nll_loss(logp, target)), warmup=0)[("forward", "aten::nll_loss_forward")]
    assert c.bytes_read == target.nbytes + 8 * 4  # one log-probability per target, not 8 x 500
    x, i = torch.randn(100, 32), torch.tensor([1, 5])
    c = count_ops(one_op(lambda: x.index_select(0, i)), warmup=0)[("forward", "aten::index_select")]
    assert c.bytes_read == i.nbytes + 2 * 32 * 4
    dest, vals = torch.zeros(100, 32), torch.ones(2, 32)
    c = count_ops(one_op(lambda: dest.index_add_(0, i, vals)), warmup=0)[("forward", "aten::index_add_")]
    assert c.bytes_written == vals.nbytes and c.bytes_read == i.nbytes + 2 * vals.nbytes  # rows it updates


def test_nll_loss_backward_reads_its_inputs_shape_only():
    logp = torch.randn(8, 500).log_softmax(-1).requires_grad_()
    target = torch.randint(0, 500, (8,))

    def step(phase):
        loss = F.nll_loss(logp, target)
        with phase("backward"):
            loss.backward()
    c = count_ops(step, warmup=0)[("backward", "aten::nll_loss_backward")]
    assert c.bytes_written == logp.nbytes and c.bytes_read < logp.nbytes / 100  # a zeroed gradient, written


def _times_at(counts, factor, roof=ROOF, bandwidth=None):
    """Times for `counts` as if each op ran at `factor` x its roof time (1.5: a plausible op)."""
    peak, bw = roof.matmul_flops["fp32"], bandwidth or roof.bandwidth
    times = {k: factor * max(c.flops / peak, c.bytes / bw) + 1e-9 for k, c in counts.items()}
    return OpTimes(times, {k: c.calls for k, c in counts.items()}, sum(times.values()), 1, "cpu")


def test_a_gather_charged_for_the_whole_table_is_caught_above_its_roof(monkeypatch):
    weight, idx = torch.randn(30522, 128), torch.randint(0, 30522, (256,))  # BERT's table, 256 tokens
    step = one_op(lambda: F.embedding(idx, weight))
    right = count_ops(step, warmup=0)
    times = _times_at(right, 1.5)  # the op, timed: 1.5x its roof time under the right count
    assert check_roofs(op_table(right, times, ROOF, overhead_s=0.0)) == []
    monkeypatch.setattr(opcount, "_partial_bytes", lambda *args: {})  # planted: every input read whole
    whole = count_ops(step, warmup=0)
    assert whole[("forward", "aten::embedding")].bytes > 50 * right[("forward", "aten::embedding")].bytes
    problems = check_roofs(op_table(whole, times, ROOF, overhead_s=0.0))
    assert problems and "aten::embedding" in problems[0] and "bytes counted right" in problems[0]


def test_a_planted_byte_undercount_is_seen_against_the_tensor_sizes(monkeypatch):
    x = torch.randn(8, 256)
    monkeypatch.setattr(opcount, "_stored_bytes", lambda t: t.numel() * t.element_size() // 2)
    c = count_ops(one_op(lambda: F.gelu(x)), warmup=0)[("forward", "aten::gelu")]
    assert c.bytes != 2 * x.nbytes  # the lesson's check (bytes == the tensors' sizes) would fail


def small_step(dropout=0.0, batch=2, seq=16):
    torch.manual_seed(0)
    model = SmallTransformer(small_config("smoke", vocab_size=256, n_layers=1, d_model=32, n_heads=2,
                                          dropout=dropout))
    data = synthetic_batch_fn(256, batch, seq, seed=0)(0, 0)
    return model, labelled_step(model, data, make_optimizer(model, 1e-3, 0.01))


def expected_step_flops(model, batch, seq):
    """The course's formula (helpers.measure.flops) less the bias adds, which FlopCounterMode does not
    count."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    biases = sum(m.bias.numel() for m in linears if m.bias is not None)
    return (model_flops_per_token(model, seq) - 6 * biases) * batch * seq


@pytest.fixture(scope="module")
def step_table():
    model, step = small_step(dropout=0.1)
    return model, profile_step(step, ROOF, overhead_s=OVERHEAD_S, steps=1)


def test_the_step_flops_are_the_formula(step_table):
    model, table = step_table
    assert check_flops(table, expected_step_flops(model, 2, 16)) == []
    classes = {r.op_class for r in table.rows}
    assert {"matmul", "LayerNorm", "GELU", "embedding", "cross-entropy", "optimizer step",
            "dropout"} <= classes


def test_a_fused_attention_kernel_recomputes_the_scores_in_its_backward():
    model, step = small_step(dropout=0.0)  # no dropout: SDPA runs its fused kernel on a CPU too
    table = op_table(count_ops(step), None, ROOF, overhead_s=OVERHEAD_S)  # counts only
    assert any(r.op_class == "attention" and r.flops > 0 for r in table.rows)
    c = model.cfg  # batch 2, 16 tokens: Q·Kᵀ once more per layer, head and sequence
    recompute = c.n_layers * 2 * c.n_heads * 2 * 16 * 16 * (c.d_model // c.n_heads)
    assert check_flops(table, expected_step_flops(model, 2, 16) + recompute) == []
    assert check_flops(table, expected_step_flops(model, 2, 16))  # without it the counts disagree


def test_a_doubled_matmul_is_caught_by_the_formula(step_table):
    model, table = step_table
    i = next(i for i, r in enumerate(table.rows) if r.label == "aten::addmm")
    rows = list(table.rows)
    rows[i] = dataclasses.replace(rows[i], flops=2 * rows[i].flops)
    problems = check_flops(dataclasses.replace(table, rows=tuple(rows)), expected_step_flops(model, 2, 16))
    assert problems and "aten::addmm" in problems[0]


def test_the_step_passes_its_checks_and_a_planted_overcount_fails_them(step_table):
    _, table = step_table
    # the made-up roofline is far below this machine's caches: only the rows' own consistency is judged here
    # (the roof rule against real timings is lesson 04's, tested in test_lesson04_checks.py)
    roof_problems = ("its compute roof", "its memory roof")
    assert [p for p in check_regimes(table) if not any(w in p for w in roof_problems)] == []
    gelu = table.row("aten::gelu")
    assert gelu.regime in ("memory", "overhead") and gelu.intensity < ROOF.ridge_point()
    k = 100 * gelu.time_s / gelu.roof_s  # planted: GELU's bytes counted so often it "ran" 100x above its roof
    rows = [dataclasses.replace(r, bytes=r.bytes * k, roof_s=r.roof_s * k) if r.label == "aten::gelu"
            else r for r in table.rows]
    problems = check_regimes(dataclasses.replace(table, rows=tuple(rows)))
    assert any("aten::gelu" in p and "its memory roof" in p for p in problems)
    rows = [dataclasses.replace(r, regime="fast") if r.label == "aten::gelu" else r for r in table.rows]
    assert any("unknown regime" in p for p in check_regimes(dataclasses.replace(table, rows=tuple(rows))))


def test_matmul_and_gelu_at_the_course_sizes_sit_either_side_of_the_ridge():
    # the smoke profile's MLP: (batch 4 x 32 tokens) x 128 -> 512, then GELU on the result
    x, w, b = torch.randn(128, 128), torch.randn(512, 128), torch.randn(512)
    h = F.linear(x, w, b)
    counts = count_ops(one_op(lambda: (F.linear(x, w, b), F.gelu(h))), warmup=0)
    table = op_table(counts, _times_at(counts, 1.5), ROOF, overhead_s=0.0)
    mm, gelu = table.row("aten::addmm"), table.row("aten::gelu")
    assert mm.intensity > ROOF.ridge_point() > gelu.intensity
    assert (mm.regime, gelu.regime) == ("compute", "memory") and (mm.roof_kind, gelu.roof_kind) == (
        "compute", "memory")
    assert check_roofs(table) == []
    fast = op_table(counts, _times_at(counts, 0.05), ROOF, overhead_s=0.0)  # planted: 20x above the roofs
    assert {p.split()[0] for p in check_roofs(fast)} == {"aten::addmm", "aten::gelu"}


def test_the_breakdown_and_the_causes_add_up_to_the_step(step_table):
    _, table = step_table
    for parts in (table.breakdown(), table.causes()):
        assert set(parts) == set(REGIMES) and all(v >= 0 for v in parts.values())
        assert math.isclose(sum(parts.values()), table.total_s, rel_tol=1e-9)
    assert table.total_s == pytest.approx(max(table.wall_s - table.profiler_cost_s,
                                              table.op_time_s + table.comm_s))
    assert table.by_class().row("matmul").time_s == pytest.approx(
        sum(r.time_s for r in table.rows if r.op_class == "matmul"))
    assert sum(table.shares().values()) == pytest.approx(1.0)


def _row(**kw):
    base = dict(label="aten::x", phase="forward", op_class="GELU", calls=2, time_s=10.0, flops=0.0,
                bytes=1.0, regime="memory", roof_s=6.0, bandwidth=1.0, fixed_s=1.0)
    return opcount_row(**{**base, **kw})


def opcount_row(**kw):
    from helpers.measure.regimes import OpRow

    return OpRow(**kw)


def test_each_op_is_split_into_its_roof_its_calls_and_the_excess():
    r = _row()  # 10 s: 1 s of calls, 6 s at its roof, 3 s below it
    assert r.split(synchronous=True) == {"roof": 6.0, "overhead": 1.0, EXCESS: 3.0}
    # a GPU op's time is its kernels': no launch in it
    assert r.split(synchronous=False) == {"roof": 6.0, "overhead": 0.0, EXCESS: 4.0}
    assert _row(time_s=0.5).split(True) == {"roof": 0.0, "overhead": 0.5, EXCESS: 0.0}  # the call, not done
    mm = _row(label="aten::mm", op_class="matmul", regime="compute", flops=1.0, compute_s=6.0)
    table = OpTable((r, mm), wall_s=25.0, device="cpu", precision="fp32", peak_flops=1.0, bandwidth=1.0,
                    overhead_s=0.5)
    c = table.causes()  # 5 s outside both ops: overhead, by the one definition
    assert c == {"compute": 6.0, "memory": 6.0, "overhead": 2.0 + 5.0, "communication": 0.0, EXCESS: 6.0}
    assert table.overhead_total_s() == 7.0 and table.outside_s == 5.0


def test_an_op_missing_from_the_profile_is_an_error_and_a_view_is_listed():
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    counts = count_ops(one_op(lambda: (a @ b).t()), warmup=0)
    times = _times_at({k: c for k, c in counts.items() if k[1] != "aten::mm"}, 1.5)
    with pytest.raises(ValueError, match=r"never timed.*aten::mm"):
        op_table(counts, times, ROOF, overhead_s=0.0)
    table = op_table(counts, _times_at({k: c for k, c in counts.items() if k[1] != "aten::t"}, 1.5), ROOF,
                     overhead_s=0.0)
    assert table.untimed == ("aten::t (forward, 1 calls): a view",)


def _reconciled(pairs, cost, device="cpu", busy=None, noise=0.0):
    r = _row()
    return OpTable((r,), wall_s=sum(p for p, _ in pairs) / len(pairs), device=device, precision="fp32",
                   peak_flops=1.0, bandwidth=1.0, overhead_s=0.5, busy_s=busy, pairs=tuple(pairs),
                   profiler_cost_s=cost, noise=noise, unprofiled_s=pairs[0][1])


def test_check_reconciled_catches_a_profile_that_does_not_account_for_the_step():
    pairs = [(30.5, 17.8), (31.0, 18.0), (30.0, 17.5)]  # pytorch/pytorch#82793's step, profiled and not
    assert check_reconciled(_reconciled(pairs, cost=0.0))  # planted: the profiler's cost not taken out
    assert check_reconciled(_reconciled(pairs, cost=12.7)) == []  # its events x their measured cost
    assert check_reconciled(_reconciled(pairs, cost=12.7, noise=TOO_BUSY)) == []  # too busy: not judged
    loaded = dataclasses.replace(_reconciled(pairs, cost=0.0), others=0.6)  # other programs took the CPUs
    assert loaded.busy.too_busy and check_reconciled(loaded) == []
    assert check_reconciled(_reconciled(pairs, cost=0.0, device="cuda", busy=40.0))  # kernels > the step
    assert check_reconciled(_reconciled(pairs, cost=0.0, device="cuda", busy=15.0)) == []
    empty = dataclasses.replace(_reconciled(pairs, cost=0.0), pairs=())
    assert "no plain step" in check_reconciled(empty)[0]


def test_time_ops_times_a_plain_step_beside_each_profiled_one():
    x, w, b = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64)
    step = one_op(lambda: F.linear(x, w, b))
    times = time_ops(step, steps=3, warmup=1)  # every aten op counted: aten::linear holds aten::t, addmm
    assert len(times.pairs) == 3 and all(p > 0 and u > 0 for p, u in times.pairs)
    assert times.unprofiled_s > 0 and times.events >= 3 and times.event_cost_s >= 0
    assert times.inside_events[("forward", "aten::linear")] >= 2  # its children's events fall inside it
    assert ("forward", "aten::addmm") not in times.times_s  # timed as part of aten::linear
    assert times.profiler_cost_s == pytest.approx(times.events * times.event_cost_s)


def test_memory_roofs_by_working_set():
    def roofs(sizes, bandwidths, beyond, cache):  # one roofline: its copy bandwidth, and roofs by working set
        return Roofline("made-up", {"fp32": 1e12}, beyond, cache_sizes=sizes, cache_bandwidths=bandwidths,
                        cache_bytes=cache)

    r = roofs((2**18, 2**20, 2**22), (80e9, 30e9, 50e9), 10e9, 2**23)
    assert r.cache_bandwidths == (80e9, 50e9, 50e9)  # a smaller set measured slower takes the larger set's
    assert r.bandwidth_for(2**19) == 80e9 and r.bandwidth_for(2**22) == 50e9
    assert r.bandwidth_for(2**10) == 80e9 and r.bandwidth_for(2**24) == 10e9  # beyond the cache
    assert r.where(2**20) == "cache" and r.where(2**24) == "memory"
    assert roofs((), (), 10e9, None).bandwidth_for(1) == 10e9  # cache unknown: lesson 00's roof
    with pytest.raises(ValueError):
        roofs((2**20, 2**18), (1e9, 1e9), 1e9, 2**23)


def test_a_read_heavy_op_is_held_to_the_fastest_pattern_not_to_a_copy(monkeypatch):
    """Issue 39, point 10: a roof from a copy alone (2 bytes counted per element) put an op that mostly reads
    above its roof ("166 % of its roof"). On a made-up memory that reads at 20 GB/s and writes at 10 GB/s (a
    written line is read first), a copy reaches 13.3 GB/s and a sum 20: the sum must be held to 20."""
    import helpers.measure.regimes as regimes
    from helpers.measure.regimes import measure_memory_roofs

    read_bw, write_bw = 20e9, 10e9

    def machine_time(fn):  # seconds this memory takes for the bytes fn reads and writes
        c = count_ops(lambda phase: fn(), warmup=0).values()
        return sum(x.bytes_read for x in c) / read_bw + sum(x.bytes_written for x in c) / write_bw

    def fake_benchmark(fn, *, name="", warmup=2, min_run_time=0.5, num_threads=None):
        t = machine_time(fn)
        return Timing(name, t, 0.0, 3, 1, (t, t, t))

    monkeypatch.setattr("helpers.core.timing.benchmark", fake_benchmark)  # what a copy was timed with
    monkeypatch.setattr(regimes, "fastest_call", lambda fn, **kw: machine_time(fn), raising=False)
    copy_bw = 2 / (1 / read_bw + 1 / write_bw)
    roof = Roofline("made-up memory", {"fp32": 1e15}, copy_bw, 512, 2**20)
    roofs = measure_memory_roofs("cpu", roof, cache_bytes=2**20, overhead_s=0.0)
    x = torch.randn(2**16)  # 256 KiB: the smallest working set measured
    counts = count_ops(one_op(lambda: torch.sum(x)), warmup=0)
    t = machine_time(lambda: torch.sum(x))
    times = OpTimes({k: t for k in counts}, {k: c.calls for k, c in counts.items()}, t, 1, "cpu")
    row = op_table(counts, times, roof, overhead_s=0.0, memory_roofs=roofs).row("aten::sum")
    assert row.roof_fraction <= 1 + 1e-9, f"a sum ran at {row.roof_fraction:.0%} of its roof"
    assert roofs.bandwidth == pytest.approx(read_bw, rel=1e-4)  # beyond the caches too: reading is fastest
    assert roofs.matmul_flops == roof.matmul_flops  # one roofline: the rates it was given, and the memory's


def test_the_cost_of_a_call_is_measured_for_each_class_of_op(monkeypatch):
    """Issue 39, point 11: priced at a one-element add, the calls of a step of small ops (a GELU sets up its
    vectorised erf, a LayerNorm its statistics) left most of its time "below the roof", where there is no work
    to be below a roof. On a made-up machine whose calls cost 15 µs (GELU), 10 µs (LayerNorm) and 1 µs (any
    other op), and whose ops take their call's cost and no more, the step's time must all be its calls'."""
    import helpers.measure.optime as optime
    import helpers.measure.regimes as regimes

    price = {"GELU": 15e-6, "LayerNorm": 10e-6}

    def cost(ops):  # seconds the made-up machine takes for these counted ops
        return sum(price.get(op_class(op, ph), 1e-6) * c.calls for (ph, op), c in ops.items())

    def fake_benchmark(fn, *, name="", warmup=2, min_run_time=0.5, num_threads=None):
        t = cost(count_ops(lambda phase: fn(), warmup=0))
        return Timing(name, t, 0.0, 3, 1, (t, t, t))

    monkeypatch.setattr(optime, "fastest_call", lambda fn, **kw: fake_benchmark(fn).median_s, raising=False)

    def fake_time_ops(step, *, device="cpu", steps=3, warmup=1, counted=None):
        times = {k: cost({k: c}) for k, c in counted.items()}
        total = sum(times.values())
        return OpTimes(times, {k: c.calls for k, c in counted.items()}, total, steps, "cpu",
                       unprofiled_s=total, pairs=((total, total),) * steps)

    monkeypatch.setattr(optime, "benchmark", fake_benchmark)
    monkeypatch.setattr(regimes, "time_ops", fake_time_ops)
    x, w, b = torch.randn(8, 8), torch.ones(8), torch.zeros(8)

    def step(phase):
        with phase("forward"):
            for _ in range(20):
                F.gelu(x), F.layer_norm(x, (8,), w, b), torch.add(x, x)
    table = profile_step(step, ROOF, steps=3)  # the default: each call priced by its class, measured now
    shares = table.shares()
    assert shares[EXCESS] < 0.01, f"{shares[EXCESS]:.0%} of a step of calls ran 'below the roof'"
    assert table.row("aten::gelu").split(True)["overhead"] == pytest.approx(20 * 15e-6)


def test_per_call_costs_are_measured_for_every_class():
    from helpers.measure.optime import CALL_CLASSES, per_call_costs

    costs = per_call_costs("cpu", min_run_time=0.01)
    assert set(costs) == set(CALL_CLASSES) and all(0 < v < 0.1 for v in costs.values())


def test_the_two_time_models():
    kw = dict(peak_flops=100e9, bandwidth=10e9, overhead_s=5e-6)
    # 1 ms of math, 0.1 ms of bytes, 100 calls x 5 µs = 0.5 ms: a CPU adds the calls, a GPU hides them
    assert predicted_time(1e8, 1e6, 100, synchronous=True, **kw) == pytest.approx(1.5e-3)
    assert predicted_time(1e8, 1e6, 100, synchronous=False, **kw) == pytest.approx(1e-3)
    assert predicted_time(1e3, 1e3, 1000, synchronous=False, **kw) == pytest.approx(5e-3)
    assert is_synchronous("cpu") and not is_synchronous("cuda")


def test_the_fixed_work_is_what_does_not_grow_with_the_batch():
    counts = {b: count_ops(small_step(batch=b)[1]) for b in (2, 8)}
    fixed = fixed_work_s(counts[2], counts[8], (2, 8), ROOF)
    adamw = sum(c.bytes for (ph, _), c in counts[2].items() if ph == "optimizer") / ROOF.bandwidth
    peak = ROOF.matmul_flops["fp32"]
    every = sum(max(c.flops / peak, c.bytes / ROOF.bandwidth) for c in counts[2].values())
    assert adamw <= fixed < every  # AdamW's traffic at least, not all of the batch-2 step's work
    with pytest.raises(ValueError):
        fixed_work_s(counts[2], counts[8], (8, 2), ROOF)


def test_profiler_times_only_the_counted_outermost_ops():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    step = one_op(lambda: [a @ b for _ in range(3)])
    counts = count_ops(step, warmup=0)
    times = time_ops(step, steps=2, warmup=1, counted=counts)
    assert times.calls[("forward", "aten::mm")] == 3
    assert 0 < times.times_s[("forward", "aten::mm")] <= times.wall_s
    assert times.device == "cpu" and times.busy_s is None


def test_communication_is_its_own_regime():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(1024)
        table = table_of(one_op(lambda: dist.all_reduce(x)))
    finally:
        dist.destroy_process_group()
    comm = [r for r in table.rows if r.op_class == "communication"]
    assert comm and all(r.regime == "communication" for r in comm)
    assert check_regimes(table) == []
    rows = [dataclasses.replace(r, regime="memory") if r.op_class == "communication" else r
            for r in table.rows]
    assert check_regimes(dataclasses.replace(table, rows=tuple(rows)))


# --- the rules --------------------------------------------------------------------------------------------

def test_classify_picks_the_largest_predicted_time():
    kw = dict(peak_flops=100e9, bandwidth=10e9, overhead_s=5e-6)
    assert classify_regime(1e9, 1e6, 1, **kw) == "compute"  # 10 ms of math, 0.1 ms of bytes
    assert classify_regime(1e6, 1e9, 1, **kw) == "memory"
    assert classify_regime(10, 40, 100, **kw) == "overhead"
    with pytest.raises(ValueError, match="bandwidth"):
        classify_regime(1, 1, 1, peak_flops=1, bandwidth=0, overhead_s=0)
    with pytest.raises(ValueError, match="flops"):
        classify_regime(-1, 1, 1, **kw)


def test_op_classes():
    assert op_class("aten::addmm") == "matmul" and op_class("aten::bmm") == "matmul"
    assert op_class("aten::_log_softmax") == "cross-entropy" and op_class("aten::_softmax") == "softmax"
    assert op_class("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert op_class("aten::native_layer_norm_backward") == "LayerNorm"
    assert op_class("aten::add_", "optimizer") == "optimizer step"
    assert op_class("c10d::allreduce_") == "communication"
    assert is_communication("nccl:all_reduce") and not is_communication("aten::mm")
    assert op_class("aten::view", is_view=True) == "views (no data)"
    with pytest.raises(ValueError):
        op_class("")


def test_sdpa_cpu_kernel_is_counted_with_the_library_formula():
    q = k = v = torch.randn(1, 2, 16, 8)
    counts = count_ops(one_op(lambda: F.scaled_dot_product_attention(q, k, v)), warmup=0)
    flops = sum(c.flops for c in counts.values() if c.flops_source == "FlopCounterMode")
    assert flops == 4 * 1 * 2 * 16 * 16 * 8  # Q·Kᵀ and P·V, 2·T·T·d each per head


def test_busy_time_is_the_union_of_intervals():
    assert busy_time([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy_time([]) == 0
    with pytest.raises(ValueError):
        busy_time([(2, 1)])


def test_per_call_overhead_is_a_few_microseconds():
    assert 0 < per_call_overhead("cpu", min_run_time=0.05) < 1e-3


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="step"):
        count_ops(None)
    with pytest.raises(ValueError, match="phase"):
        count_ops(lambda phase: phase("").__enter__(), warmup=0)
    with pytest.raises(ValueError, match="warmup"):
        count_ops(lambda phase: None, warmup=-1)
    with pytest.raises(ValueError, match="steps"):
        time_ops(lambda phase: None, steps=0)
    with pytest.raises(ValueError, match="optimizer"):
        labelled_step(torch.nn.Linear(2, 2), {}, optimizer=None)
    with pytest.raises(ValueError, match="empty"):
        op_table({}, OpTimes({}, {}, 1.0, 1, "cpu"), ROOF, overhead_s=0)
    counts = count_ops(one_op(lambda: torch.ones(2) + 1), warmup=0)
    with pytest.raises(ValueError, match="bf16"):  # the roofline measured fp32 only
        op_table(counts, OpTimes({}, {}, 1.0, 1, "cpu"), ROOF, precision="bf16", overhead_s=0)
    with pytest.raises(ValueError, match="positive"):
        check_flops(table_of(one_op(lambda: torch.ones(2) + 1)), 0)


# --- lesson 05 and lesson 08 ------------------------------------------------------------------------------

def test_fusion_report_says_what_compile_left(step_table):
    _, table = step_table
    compiled = OpTimes({}, {}, 1.0, 1, "cpu", top_level={"aten::mm": 99, "aten::addmm": 99})
    text = fusion_report(table, compiled).to_markdown()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    assert "still called as library ops" in rows["matmul"]
    assert "fused into generated kernels" in rows["GELU"]
    assert "fused into generated kernels" in rows["LayerNorm"]


def test_why_it_paid_names_the_regimes_and_the_bound():
    b = {"compute": 0.2, "memory": 0.6, "overhead": 0.2, "communication": 0.0}
    paid = why_it_paid("compile", b, speedup=1.3, paid=True)
    assert "it paid (1.30x)" in paid and "60 % memory-bound" in paid and "at most 5.00x" in paid
    assert "only 20 % compute-bound" in why_it_paid("precision", b, speedup=0.9, paid=False, value="tf32")
    assert "only 20 % overhead-bound" in why_it_paid("cuda graphs", b, speedup=1.0, paid=False)
    assert "60 % memory-bound and 20 % overhead-bound" in why_it_paid("fused_adamw", b, speedup=1, paid=False)
    with pytest.raises(ValueError, match="value="):
        why_it_paid("precision", b, speedup=1, paid=True)  # which precision?
    assert amdahl_bound(0.5) == 2 and amdahl_bound(1.0) == math.inf
    with pytest.raises(ValueError, match="unknown optimisation"):
        why_it_paid("magic", b, speedup=1, paid=True)
    with pytest.raises(ValueError, match="regimes"):
        why_it_paid("compile", {"python": 1.0}, speedup=1, paid=True)
    with pytest.raises(ValueError):
        amdahl_bound(1.5)


# --- predict, then measure --------------------------------------------------------------------------------

def timing(median, iqr=0.0):
    return Timing("t", median, iqr, 5, 1)


def test_effect_is_the_speed_up_per_unit_of_work_with_its_noise():
    e = effect(timing(2.0, 0.2), timing(1.0, 0.05))
    assert e.speedup == 2.0 and e.noise == pytest.approx(0.1) and e.helps
    e = effect(timing(1.0), timing(4.0), work_ratio=8)  # 8x the work in 4x the time: 2x the throughput
    assert e.speedup == 2.0
    assert not effect(timing(1.0, 0.2), timing(0.9, 0.0)).helps  # 1.11x is inside 20 % noise
    assert not_measured("no GPU").helps is None
    with pytest.raises(ValueError):
        effect(timing(0.0), timing(1.0))
    with pytest.raises(ValueError):
        effect(timing(1.0), timing(1.0), work_ratio=0)


def test_score_predictions_helped_most_not_helped_at_all():
    effects = {
        "compute-bound": {"bf16": Effect(0.1, 0.02), "bigger batch": Effect(1.5, 0.05),
                          "CUDA graphs": not_measured("no GPU")},
        "memory-bound": {"compile": Effect(2.0, 0.1), "bf16": Effect(1.3, 0.1)},
        "overhead-bound": {"bigger batch": Effect(7.0, 0.1)},
    }
    preds = blank_predictions()
    assert set(preds) == set(OP_KINDS) and all(v is None for v in preds.values())
    preds.update({"compute-bound": ("bf16", 2.0), "memory-bound": ("bf16", 1.3),
                  "overhead-bound": ("CUDA graphs", 3.0)})
    locked = lock_predictions(preds)
    result = {r["kind"]: r for r in score_predictions(locked, effects, measured_at=start_measuring())}
    assert result["compute-bound"]["verdict"] == "did not hold"
    assert result["compute-bound"]["best"] == "bigger batch"
    assert result["compute-bound"]["off"] == pytest.approx(0.05)  # 0.1x measured for the 2x predicted
    # bf16 helped the memory-bound op (1.3x, beyond its noise) but compile helped it most: not held
    assert result["memory-bound"]["verdict"] == "did not hold" and result["memory-bound"]["best"] == "compile"
    assert result["overhead-bound"]["verdict"] == "not testable here"
    tied = {"memory-bound": {"compile": Effect(2.0, 0.1), "bf16": Effect(1.9, 0.1)}}
    locked = lock_predictions({"memory-bound": ("bf16", 2.0)})
    verdict = score_predictions(locked, tied, measured_at=start_measuring())[1]["verdict"]
    assert verdict.startswith("held (tied with compile")
    blank_locked = lock_predictions(blank_predictions())
    blank = {r["kind"]: r["verdict"]
             for r in score_predictions(blank_locked, effects, measured_at=start_measuring())}
    assert set(blank.values()) == {"not filled in"}


def test_a_prediction_made_after_the_measurement_is_refused():
    effects = {"memory-bound": {"compile": Effect(2.0, 0.1)}}
    began = start_measuring()
    late = lock_predictions({"memory-bound": ("compile", 2.0)})  # locked after the measurement began
    verdict = score_predictions(late, effects, measured_at=began)[1]["verdict"]
    assert verdict.startswith("refused")
    with pytest.raises(ValueError, match="lock_predictions"):
        score_predictions({"memory-bound": ("compile", 2.0)}, effects, measured_at=began)
    with pytest.raises(ValueError, match="choose|not one of"):
        lock_predictions({"memory-bound": ("fusion", 2.0)})
    with pytest.raises(ValueError, match="speed-up"):
        lock_predictions({"memory-bound": ("compile", "a lot")})
    with pytest.raises(ValueError, match="op kind"):
        lock_predictions({"matmul": ("bf16", 2.0)})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_graphs_are_refused_on_a_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        cuda_graphed(lambda: None)


def test_the_chart_draws_both_panels(step_table):
    from course.plots import where_time_goes_chart

    _, table = step_table
    fig = where_time_goes_chart(ROOF, {"small": table.points()}, {"small": table.breakdown()})
    left, right = fig.axes
    assert "FLOP/byte" in left.get_xlabel() and left.get_xscale() == "log"
    assert "ms" in right.get_xlabel()
    # the same ops in two models: each op is named once, so the labels do not print over each other
    fig2 = where_time_goes_chart(ROOF, {"a": table.points(), "b": table.points()},
                                 {"a": table.breakdown(), "b": table.breakdown()})
    names = [t.get_text().strip("_") for t in fig2.axes[0].texts if "ridge" not in t.get_text()]
    assert names and len(names) == len(set(names)), names
    with pytest.raises(ValueError, match="regime"):
        where_time_goes_chart(ROOF, {}, {"small": {"python": 1.0}})
    with contextlib.suppress(Exception):
        import matplotlib.pyplot as plt
        plt.close(fig)
