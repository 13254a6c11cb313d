"""The tools of lesson 04, read together: helpers.opcount's counts agree with independent ones (hand formulas,
tensor sizes), helpers.optime times the counted ops, helpers.regimes' regimes agree with the ridge point and
its checks fail on planted errors, helpers.predictions scores predictions against measured effects."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import helpers.opcount as opcount
from helpers.flops import model_flops_per_token
from helpers.models import SmallTransformer, small_config
from helpers.opcount import count_ops, is_communication, labelled_step, op_class
from helpers.optime import OpTimes, busy_time, cuda_graphed, per_call_overhead, time_ops
from helpers.predictions import OP_KINDS, Effect, blank_predictions, effect, not_measured, score_predictions
from helpers.regimes import (
    REGIMES,
    amdahl_bound,
    check_flops,
    check_regimes,
    classify,
    fusion_report,
    op_table,
    profile_step,
    why_it_paid,
)
from helpers.roofline import Roofline
from helpers.synthetic import synthetic_batch_fn
from helpers.timing import Timing
from helpers.train import make_optimizer

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
    """The course's formula (helpers.flops) less the bias adds, which FlopCounterMode does not count."""
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
    table = op_table(count_ops(step), OpTimes({}, {}, 1.0, 1, "cpu"), ROOF, overhead_s=OVERHEAD_S)
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


def test_regimes_match_the_ridge_and_a_planted_one_is_caught(step_table):
    _, table = step_table
    assert check_regimes(table) == []
    gelu = table.row("aten::gelu")
    assert gelu.regime in ("memory", "overhead") and gelu.intensity < ROOF.ridge_point()
    rows = [dataclasses.replace(r, regime="compute") if r.label == "aten::gelu" else r for r in table.rows]
    problems = check_regimes(dataclasses.replace(table, rows=tuple(rows)))
    assert any("aten::gelu" in p and "left of the ridge" in p for p in problems)


def test_matmul_and_gelu_at_the_course_sizes_sit_either_side_of_the_ridge():
    # the smoke profile's MLP: (batch 4 x 32 tokens) x 128 -> 512, then GELU on the result
    x, w, b = torch.randn(128, 128), torch.randn(512, 128), torch.randn(512)
    h = F.linear(x, w, b)
    table = table_of(one_op(lambda: (F.linear(x, w, b), F.gelu(h))), overhead_s=0.0)
    mm, gelu = table.row("aten::addmm"), table.row("aten::gelu")
    assert mm.intensity > ROOF.ridge_point() > gelu.intensity
    assert (mm.regime, gelu.regime) == ("compute", "memory") and check_regimes(table) == []
    rows = [dataclasses.replace(r, regime="memory") if r is mm else r for r in table.rows]  # planted
    problems = check_regimes(dataclasses.replace(table, rows=tuple(rows)))
    assert any("aten::addmm" in p and "right of the ridge" in p for p in problems)


def test_the_breakdown_adds_up_to_the_profiled_step(step_table):
    _, table = step_table
    b = table.breakdown()
    assert set(b) == set(REGIMES) and all(v >= 0 for v in b.values())
    assert math.isclose(sum(b.values()), max(table.wall_s, table.op_time_s), rel_tol=1e-9)
    assert table.by_class().row("matmul").time_s == pytest.approx(
        sum(r.time_s for r in table.rows if r.op_class == "matmul"))


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
    assert classify(1e9, 1e6, 1, **kw) == "compute"  # 10 ms of math, 0.1 ms of bytes
    assert classify(1e6, 1e9, 1, **kw) == "memory"
    assert classify(10, 40, 100, **kw) == "overhead"
    with pytest.raises(ValueError, match="bandwidth"):
        classify(1, 1, 1, peak_flops=1, bandwidth=0, overhead_s=0)
    with pytest.raises(ValueError, match="flops"):
        classify(-1, 1, 1, **kw)


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


def test_score_predictions():
    effects = {
        "compute-bound": {"bf16": Effect(0.1, 0.02), "bigger batch": Effect(1.5, 0.05),
                          "CUDA graphs": not_measured("no GPU")},
        "memory-bound": {"compile": Effect(2.0, 0.1), "bf16": Effect(0.9, 0.1)},
        "overhead-bound": {"bigger batch": Effect(7.0, 0.1)},
    }
    preds = blank_predictions()
    assert set(preds) == set(OP_KINDS) and all(v is None for v in preds.values())
    preds.update({"compute-bound": "bf16", "memory-bound": "compile", "overhead-bound": "CUDA graphs"})
    result = {r["kind"]: r for r in score_predictions(preds, effects)}
    assert result["compute-bound"]["verdict"] == "did not hold"
    assert result["compute-bound"]["best"] == "bigger batch"
    assert result["memory-bound"]["verdict"] == "held" and result["memory-bound"]["best"] == "compile"
    assert result["overhead-bound"]["verdict"] == "not testable here"
    blank = {r["kind"]: r["verdict"] for r in score_predictions(blank_predictions(), effects)}
    assert set(blank.values()) == {"not filled in"}
    with pytest.raises(ValueError, match="choose one of"):
        score_predictions({"memory-bound": "fusion"}, effects)
    with pytest.raises(ValueError, match="op kind"):
        score_predictions({"matmul": "bf16"}, effects)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_graphs_are_refused_on_a_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        cuda_graphed(lambda: None)


def test_the_chart_draws_both_panels(step_table):
    from helpers.plots import where_time_goes_chart

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
