"""Lesson 01's checks (course.lessons.lesson01), each run on what the lesson gives it and on a planted error
that it must catch. The Triton steps' skip without triton is tested in tests/test_kernels.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from course.lessons import lesson01
from helpers.model.attention import AttentionMaps, naive_attention, sdpa_attention


@pytest.fixture
def S() -> SimpleNamespace:
    return SimpleNamespace(BATCH=1, HEADS=4, SEQ=64, HEAD_DIM=16, DTYPE=torch.float32,
                           DEVICE=torch.device("cpu"), SCORE_STD=3.0, REL_TOL=1e-5, SWEEP=[32, 64],
                           MIN_RUN_TIME=0.01, WINDOW=4)


def test_inputs_spread_as_a_trained_models_and_near_uniform_ones_fail(S, capsys) -> None:
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(S.BATCH, S.HEADS, S.SEQ, S)
    lesson01.check_inputs(q, k, v, S)
    assert capsys.readouterr().out.startswith("checked: q, k, v are (B, H, N, d)")
    with pytest.raises(AssertionError, match="near-uniform"):  # planted: unscaled weights, scores of std ~0.1
        lesson01.check_inputs(q * 0.1, k * 0.1, v, S)
    with pytest.raises(AssertionError, match=r"want \(B, H, N, d\)"):  # planted: heads and tokens exchanged
        lesson01.check_inputs(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), S)


def test_the_agreement_check_fails_on_swapped_heads_and_a_missing_scale(S) -> None:
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(1, 4, 64, S)
    ref = sdpa_attention(q, k, v, backend="math")
    assert lesson01.check_agreement({"naive": naive_attention(q, k, v)}, ref, S.REL_TOL) < S.REL_TOL
    with pytest.raises(AssertionError, match="no scale: relative error"):  # planted: softmax(QKᵀ)V
        lesson01.check_agreement({"no scale": torch.softmax(q @ k.transpose(-2, -1), -1) @ v}, ref, S.REL_TOL)
    assert lesson01.check_catches_swapped_heads(ref, ref, S.REL_TOL) > 10 * S.REL_TOL


def test_the_swapped_heads_check_fails_when_the_agreement_cannot_see_heads(S, monkeypatch) -> None:
    """Planted: an agreement measured over the whole tensor, blind to which head is which."""
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(1, 4, 64, S)
    ref = sdpa_attention(q, k, v, backend="math")
    monkeypatch.setattr(lesson01, "attention_agreement",
                        lambda out, r: float((out.sort(1).values - r.sort(1).values).norm() / r.norm()))
    with pytest.raises(AssertionError, match="did not catch two swapped heads"):
        lesson01.check_catches_swapped_heads(ref, ref, S.REL_TOL)


def test_sdpa_is_checked_against_the_naive_formula_at_each_length(S, monkeypatch) -> None:
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(1, 2, 48, S)
    lesson01.check_sdpa_matches_naive(q, k, v, S.REL_TOL)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(lesson01.F, "scaled_dot_product_attention",  # planted: a causal SDPA
                        lambda *a: sdpa(*a, is_causal=True))
    with pytest.raises(AssertionError, match="N=48: SDPA and naive differ"):
        lesson01.check_sdpa_matches_naive(q, k, v, S.REL_TOL)


def test_the_sweep_gives_slopes_a_table_and_a_figure(S) -> None:
    # synthetic numbers: naive memory grows as N², SDPA's as N
    sweep = {"naive": {32: (0.002, 4 * 32**2), 64: (0.008, 4 * 64**2)},
             "SDPA": {32: (0.001, 100 * 32), 64: (0.002, 100 * 64)}}
    out = lesson01.memory_slopes(sweep)
    assert out["memory slope naive"] == pytest.approx(2) and out["memory slope sdpa"] == pytest.approx(1)
    assert out["time ratio long"] / out["time ratio short"] == pytest.approx(2)
    assert lesson01.sweep_table(sweep, S).column("N") == [32, 64]
    assert len(lesson01.sweep_chart(sweep, S).axes) == 2


def test_the_backends_are_checked_before_they_are_timed(S, monkeypatch) -> None:
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(1, 2, 32, S)
    ref = sdpa_attention(q, k, v, backend="math")
    # the kernel a plain call runs is read from the profiler: tests/test_attention.py tests that
    monkeypatch.setattr(lesson01, "sdpa_backend_used", lambda q, k, v: "flash")
    found = lesson01.sdpa_backends(q, k, v, S)
    monkeypatch.setattr(lesson01, "benchmark", lambda fn, name, **kw: (fn(), name)[1])  # checked, not timed
    assert found["backends"][0] == "math" and found["unexpected"] == []
    assert lesson01.backends_table(found, S).column("backend") == ["math", "flash", "efficient", "cudnn"]
    assert set(lesson01.time_backends(q, k, v, ref, found, S)) == set(found["backends"])
    # planted: a backend whose output is another one's (the reference's queries reversed)
    with pytest.raises(AssertionError, match="SDPA's math backend: relative error"):
        lesson01.time_backends(q, k, v, ref.flip(2), found, S)


def test_the_masked_weights_check_fails_on_a_missing_mask() -> None:
    torch.manual_seed(0)
    real = torch.tensor([True] * 6 + [False] * 2)
    x, eye = torch.randn(1, 1, 8, 8), torch.eye(8).view(1, 1, 8, 8)
    lesson01.check_masked_weights(naive_attention(x, x, eye, causal=True, key_padding_mask=real[None])[0, 0],
                                  real)
    with pytest.raises(AssertionError, match="future key"):  # planted: causal forgotten
        lesson01.check_masked_weights(naive_attention(x, x, eye, key_padding_mask=real[None])[0, 0], real)
    with pytest.raises(AssertionError, match="padding"):  # planted: padding mask forgotten
        lesson01.check_masked_weights(naive_attention(x, x, eye, causal=True)[0, 0], real)


def test_flex_is_checked_against_a_dense_mask_built_from_the_window(S) -> None:
    """FlexAttention stands in as SDPA with the right mask; planted: a window one token too wide fails."""
    torch.manual_seed(0)
    q, k, v = lesson01.spread_qkv(1, 2, 32, S)
    idx = torch.arange(32)

    def windowed(width):
        allowed = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] <= width)
        return lambda q, k, v, block_mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    right = windowed(S.WINDOW)
    assert lesson01.check_flex(right, (q, k, v), None, right(q, k, v), S) > 0
    wide = windowed(S.WINDOW + 1)
    with pytest.raises(AssertionError, match="differs from SDPA with the dense mask"):
        lesson01.check_flex(wide, (q, k, v), None, wide(q, k, v), S)


def _maps(tokens: list[str], layers: int = 2, heads: int = 3) -> AttentionMaps:
    n = len(tokens)
    return AttentionMaps(maps=torch.softmax(torch.randn(layers, heads, n, n), -1), tokens=tokens)


def test_the_maps_check_fails_on_padding_and_rows_that_do_not_sum_to_one() -> None:
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, num_attention_heads=3))

    def tokenizer(text):
        return {"input_ids": text.split()}

    texts = ["a b c", "d e"]
    lesson01.check_maps([_maps(["a", "b", "c"]), _maps(["d", "e"])], model, tokenizer, texts)
    with pytest.raises(AssertionError, match="no \\[PAD\\]"):  # planted: the padded batch, not cut per text
        lesson01.check_maps([_maps(["a", "b", "c"]), _maps(["d", "e", "[PAD]"])], model, tokenizer, texts)
    bad = _maps(["d", "e"])
    bad.maps[0, 0, 0] *= 2
    with pytest.raises(AssertionError, match="does not sum to 1"):  # planted: a row not normalised
        lesson01.check_maps([_maps(["a", "b", "c"]), bad], model, tokenizer, texts)


def test_source_from_prints_from_the_marker() -> None:
    assert lesson01.source_from("a\nb = 1\nc\nd", "b =", lines=2) == "b = 1\nc"
    assert lesson01.source_from(naive_attention, "def naive_attention").startswith("def naive_attention")
    with pytest.raises(ValueError, match="no line of the source contains"):
        lesson01.source_from("a\nb", "zzz")


def test_the_sweeps_times_get_no_verdict_on_a_busy_machine(S) -> None:
    from helpers.core.timing import CpuLoad

    measured = {"backends": {"kernel": "flash", "backends": ["math", "flash"], "unexpected": [],
                             "kernel expected": ["flash"]},
                "memory slope naive": 2.0, "memory slope sdpa": 1.0, "memory ratio": 8.0,
                "tiled vs naive memory": 8.0, "time ratio short": 1.2, "time ratio long": 2.5,
                "largest relative error": 1e-7, "swapped heads error": 1.0}
    timed = ["naive / SDPA time at N=64", "the latency advantage, longest N / shortest N"]
    for load, want in ((None, "holds"), (CpuLoad(0.0, 5.0, 2), "holds"), (CpuLoad(0.7, 5.0, 2),
                                                                           "too busy to judge")):
        verdicts = lesson01.summary_table(dict(measured, **{"sweep load": load}), S).verdicts
        # planted: other programs took 70 % of the CPUs while the sweep ran (issue 39: two Run Alls under load
        # said "holds", then "does not hold" at 0.63x, for the latency advantage)
        assert [verdicts[k] for k in timed] == [want, want], (load, verdicts)
        assert verdicts["naive / SDPA peak memory at N=64 (SDPA: its flash kernel here)"] == "holds"  # memory
