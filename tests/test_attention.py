"""helpers.model.attention: naive and tiled attention agree with SDPA's math backend; masks; memory; maps."""

from __future__ import annotations

import pytest
import torch

from helpers.measure.memory import peak_increase_bytes
from helpers.model.attention import (
    AttentionMaps,
    attention_flops,
    capture_attention_maps,
    expected_sdpa_backends,
    expected_sdpa_default,
    flex_refusal,
    naive_attention,
    naive_attention_bytes,
    probe_sdpa_backends,
    sdpa_attention,
    sdpa_backend_used,
    tiled_attention,
)

# fp32 on CPU: the three compute the same sums in a different order; differences seen are ~1e-6.
ATOL, RTOL = 1e-5, 1e-4


def _inputs(b: int, h: int, tq: int, tk: int, d: int, seed: int, padded: bool):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, d, generator=g)
    k = torch.randn(b, h, tk, d, generator=g)
    v = torch.randn(b, h, tk, d, generator=g)
    mask = None
    if padded:  # each sequence keeps a random-length prefix of real keys (at least one)
        lengths = torch.randint(1, tk + 1, (b,), generator=g)
        mask = torch.arange(tk)[None, :] < lengths[:, None]  # (B, Tk), True = real
    return q, k, v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("tq,tk", [(37, 37), (50, 50), (13, 29)])  # not multiples of the block sizes
def test_naive_and_tiled_match_sdpa_math(causal: bool, padded: bool, tq: int, tk: int) -> None:
    q, k, v, mask = _inputs(2, 3, tq, tk, 16, seed=tq * 100 + tk + 7 * causal + padded, padded=padded)
    ref = sdpa_attention(q, k, v, causal=causal, key_padding_mask=mask, backend="math")
    naive = naive_attention(q, k, v, causal=causal, key_padding_mask=mask)
    tiled = tiled_attention(q, k, v, causal=causal, key_padding_mask=mask, block_q=16, block_k=8)
    torch.testing.assert_close(naive, ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(tiled, ref, atol=ATOL, rtol=RTOL)


def test_masks_change_the_result() -> None:
    """A check that would pass if masks were silently ignored is no check: they must matter."""
    q, k, v, mask = _inputs(2, 2, 20, 20, 16, seed=3, padded=False)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[:, 10:] = False
    plain = tiled_attention(q, k, v, block_q=8, block_k=8)
    assert not torch.allclose(plain, tiled_attention(q, k, v, causal=True, block_q=8, block_k=8), atol=1e-3)
    assert not torch.allclose(plain, tiled_attention(q, k, v, key_padding_mask=mask, block_q=8, block_k=8),
                              atol=1e-3)
    # causal: the first query sees only the first key, so its output is that key's value
    torch.testing.assert_close(naive_attention(q, k, v, causal=True)[:, :, 0], v[:, :, 0])


def test_bad_shapes_name_what_they_got() -> None:
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match=r"q \(1, 2, 8, 16\).*k \(1, 2, 8, 32\)"):
        naive_attention(q, torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32))
    with pytest.raises(ValueError, match=r"\(B, Tk\) = \(1, 8\), got \(1, 9\)"):
        tiled_attention(q, q, q, key_padding_mask=torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="need q"):
        sdpa_attention(q, q[:, :1], q)
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        sdpa_attention(q, q, q, backend="fastest")


def test_probe_reports_instead_of_raising() -> None:
    q = torch.randn(1, 2, 16, 16)
    result = probe_sdpa_backends(q, q, q)
    assert set(result) == {"math", "flash", "efficient", "cudnn"}
    assert result["math"] is None  # the math backend runs everywhere
    if not torch.cuda.is_available():
        assert isinstance(result["cudnn"], str) and result["cudnn"]  # cuDNN needs a GPU: a reason, no crash


def test_expected_backends_are_what_runs_on_this_cpu() -> None:
    """torch's rules as helpers.model.attention states them agree with what torch does here, for each
    backend."""
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 2, 16, 64, dtype=dtype)
        ran = {name: reason is None for name, reason in probe_sdpa_backends(q, q, q).items()}
        expected = {name: reason is None for name, reason in expected_sdpa_backends("cpu", dtype, 64).items()}
        assert ran == expected, dtype
        assert sdpa_backend_used(q, q, q) == expected_sdpa_default("cpu", dtype, 64)[0] == "flash"


def test_the_backend_used_is_read_from_what_ran() -> None:
    """With flash switched off, a plain call runs math, and sdpa_backend_used says so (not a fixed answer)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 32)
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_backend_used(q, q, q) == "math"


@pytest.mark.parametrize("gpu,dtype,masked,default", [
    ((7, 5), torch.float16, False, ("efficient",)),  # a T4: no flash, no cuDNN below sm_80
    ((7, 5), torch.bfloat16, False, ("math",)),  # a T4 in bf16: the memory-efficient kernel refuses it too
    ((8, 0), torch.bfloat16, False, ("flash",)),
    ((8, 0), torch.bfloat16, True, ("efficient",)),  # flash takes no mask
    ((8, 6), torch.float32, False, ("efficient",)),  # flash takes no fp32
    ((9, 0), torch.bfloat16, False, ("cudnn", "flash")),  # recent torch builds try cuDNN first on sm_90
])
def test_expected_sdpa_kernel_per_capability(gpu, dtype, masked, default) -> None:
    """The lesson's claim per GPU class, from torch's sdp_utils.cpp rules (cuDNN 9.10 assumed)."""
    got = expected_sdpa_default("cuda", dtype, 128, masked=masked, capability=gpu, cudnn_version=91000)
    assert got == default
    rules = expected_sdpa_backends("cuda", dtype, 128, masked=masked, capability=gpu, cudnn_version=91000)
    if gpu < (8, 0):
        assert "sm_80" in rules["flash"] and "sm_75" in rules["flash"] and "sm_80" in rules["cudnn"]
    assert rules["cudnn"] is not None or expected_sdpa_backends(
        "cuda", dtype, 128, capability=gpu, cudnn_version=0)["cudnn"] is not None  # no cuDNN: refused


def test_flex_is_refused_below_sm80_with_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakegpu import fake_gpu

    assert flex_refusal("cpu") is None
    fake_gpu(monkeypatch, "T4")
    assert "pytorch/pytorch#164813" in flex_refusal("cuda") and "sm_75" in flex_refusal("cuda")
    fake_gpu(monkeypatch, "L4")
    assert flex_refusal("cuda") is None


def test_naive_attention_bytes_is_what_the_naive_call_takes() -> None:
    """The estimate the benchmark sizes its GPU runs by, against the peak measured here (CPU allocator)."""
    for dtype, causal in ((torch.float32, False), (torch.bfloat16, True)):
        q = torch.randn(1, 4, 384, 32, dtype=dtype)
        measured = peak_increase_bytes(lambda: naive_attention(q, q, q, causal=causal), "cpu")
        estimate = naive_attention_bytes(1, 4, 384, 384, 32, dtype)
        assert 0.9 <= measured / estimate <= 1.1, (dtype, measured, estimate)


def test_naive_memory_grows_with_the_score_matrix() -> None:
    """Measured with the profiler's allocation records: the naive call holds (B, H, N, N) fp32 scores."""
    b, h, n, d = 1, 4, 512, 32
    q = torch.randn(b, h, n, d)
    scores_bytes = b * h * n * n * 4
    naive = peak_increase_bytes(lambda: naive_attention(q, q, q), "cpu")
    half = q[:, :, : n // 2]
    small = peak_increase_bytes(lambda: naive_attention(half, half, half))
    assert naive >= scores_bytes, (naive, scores_bytes)
    assert naive / small > 3.0, (naive, small)  # doubling N: about 4x (N²), not 2x
    sdpa = peak_increase_bytes(lambda: sdpa_attention(q, q, q, backend="flash"), "cpu")
    assert sdpa < scores_bytes, (sdpa, scores_bytes)  # CPU flash kernel: tiles, no (N, N) matrix
    with pytest.raises(ValueError, match="measures 'cuda' .* or 'cpu' .*, not meta"):
        peak_increase_bytes(lambda: None, "meta")


def test_attention_flops() -> None:
    assert attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert attention_flops(1, 1, 8, 8, 4, causal=True) == 2 * 8 * 8 * 4


def test_capture_maps_from_offline_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from helpers.model.models import load_bert

    model, tok = load_bert(attn_implementation="sdpa", verbose=False)
    maps = capture_attention_maps(model, tok, "Attention maps show where each token looks.", verbose=False)
    n_tokens = len(tok("Attention maps show where each token looks.")["input_ids"])
    cfg = model.config
    assert maps.maps.shape == (cfg.num_hidden_layers, cfg.num_attention_heads, n_tokens, n_tokens)
    torch.testing.assert_close(maps.maps.sum(-1), torch.ones(maps.maps.shape[:-1]), atol=1e-5, rtol=0)
    assert maps.switched_to_naive and maps.tokens[0] == "[CLS]" and maps.tokens[-1] == "[SEP]"
    assert model.config._attn_implementation == "sdpa"  # switched back after the capture


def test_maps_token_count_must_match() -> None:
    with pytest.raises(ValueError, match=r"3 tokens given for maps over 4 tokens"):
        AttentionMaps(maps=torch.rand(2, 2, 4, 4), tokens=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"\(layers, heads, tokens, tokens\)"):
        AttentionMaps(maps=torch.rand(2, 4, 4), tokens=["a", "b", "c", "d"])


def test_sweep_script_checks_then_times_and_writes_stamped_results(tmp_path) -> None:
    """benchmarks/attention_sweep.py at tiny sizes: rows for every implementation, files stamped by device."""
    import json

    bench = _sweep_module()
    result = bench.sweep([32, 64], impls=["naive", "sdpa-math", "sdpa-cudnn"], batch=1, heads=2, head_dim=16,
                         dtype="float32", causal=False, device=torch.device("cpu"), min_run_time=0.01,
                         verbose=False)
    rows = {(r["impl"], r["seq_len"]): r for r in result["rows"]}
    assert len(rows) == 6
    assert rows[("naive", 64)]["status"] == "ok" and rows[("naive", 64)]["max_abs_err"] < 1e-4
    assert rows[("naive", 64)]["median_s"] > 0 and rows[("naive", 64)]["peak_bytes"] > 0
    if not torch.cuda.is_available():
        cudnn = rows[("sdpa-cudnn", 32)]
        assert cudnn["status"] == "unavailable" and cudnn["median_s"] is None
    paths = bench.write_results(result, tmp_path)
    assert [p.name for p in paths] == [f"attention_sweep-cpu{s}" for s in (".json", ".md", ".png")]
    stamp = json.loads(paths[0].read_text())["stamp"]
    assert stamp["torch"] == torch.__version__ and stamp["date"] and stamp["device"]
    assert "| 64 |" in paths[1].read_text()


def _sweep_module():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import attention_sweep
    finally:
        sys.path.pop(0)
    return attention_sweep


def test_sweep_on_a_15_gb_t4_skips_what_cannot_fit_and_runs_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The --gpu-target sizes (B=4, H=16, d=128) on a faked T4: the naive formula at N=8192 needs ~17 GB and
    is reported "not run" with that need, before anything is allocated; what fits is attempted. Planted: the
    same case on a faked 80 GB A100 is attempted (and fails here, where nothing can be allocated on it)."""
    from fakegpu import fake_gpu

    bench = _sweep_module()
    sizes = dict(batch=4, heads=16, head_dim=128, causal=False, min_run_time=0.01)
    t4 = fake_gpu(monkeypatch, "T4")
    assert bench.gpu_dtype(torch.device("cuda")) == "fp16"
    row = bench.run_case("naive", 8192, dtype="fp16", device=torch.device("cuda"), **sizes)
    assert row["status"] == "not run" and "needs ~16.6 GiB" in row["reason"], row
    need = {(impl, n): bench.case_bytes(impl, n, batch=4, heads=16, head_dim=128, dtype="fp16",
                                        total_memory=t4.total_memory)
            for impl in bench.IMPLS for n in (4096, 8192, 16384)}
    fits = {key for key, bytes_ in need.items() if bytes_ <= 0.9 * t4.total_memory}
    assert {(impl, n) for impl in bench.FUSED for n in (4096, 8192, 16384)} <= fits
    assert ("naive", 4096) in fits and ("naive", 8192) not in fits and ("sdpa-math", 8192) not in fits
    tiles = bench.triton_tiles(torch.device("cuda"), 128)
    assert tiles["attn_bwd_dkdv"] == ["16x32, 4 warps, 2 stages"]
    fake_gpu(monkeypatch, "A100-80")
    assert bench.gpu_dtype(torch.device("cuda")) == "bf16"
    with pytest.raises(RuntimeError, match="CUDA"):  # attempted: this torch cannot allocate on the fake GPU
        bench.run_case("naive", 8192, dtype="bf16", device=torch.device("cuda"), **sizes)


@pytest.fixture(scope="module")
def minilm():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    try:
        from helpers.model.models import load_bert

        yield load_bert(attn_implementation="sdpa", verbose=False)
    finally:
        mp.undo()


def test_capture_restores_the_attention_implementation_when_it_fails(minilm) -> None:
    model, tok = minilm

    def broken_tokenizer(*args, **kwargs):
        raise RuntimeError("simulated failure after the switch")

    with pytest.raises(RuntimeError, match="simulated"):
        capture_attention_maps(model, broken_tokenizer, "some text", verbose=False)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="non-empty"):
        capture_attention_maps(model, tok, ["fine", ""], verbose=False)
    assert model.config._attn_implementation == "sdpa"


def test_maps_of_a_text_in_a_padded_batch_equal_its_maps_alone(minilm) -> None:
    model, tok = minilm
    texts = ["A short one.", "Attention maps of a longer text, which sets the padded length of the batch.",
             "Middle length text here."]
    batch = capture_attention_maps(model, tok, texts, verbose=False)
    assert isinstance(batch, list) and len(batch) == 3
    for text, maps in zip(texts, batch):
        alone = capture_attention_maps(model, tok, text, verbose=False)
        assert maps.tokens == alone.tokens and "[PAD]" not in maps.tokens
        assert maps.maps.shape[-1] == len(tok(text)["input_ids"])
        # fp32, same weights; only the batch's extra (masked) key columns differ: rounding-level agreement
        torch.testing.assert_close(maps.maps, alone.maps, atol=1e-5, rtol=0)
        torch.testing.assert_close(maps.maps.sum(-1), torch.ones(maps.maps.shape[:-1]), atol=1e-5, rtol=0)
    # the check can fail: the padded rows of the short text, kept, would not match its maps alone
    assert batch[0].maps.shape != batch[1].maps.shape


def _spread_qkv(b=1, h=4, n=256, d=64, score_std=3.0, seed=0):
    """q, k, v whose scores q·k/√d have std `score_std` (a trained model's spread, not near-uniform)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    return q * score_std ** 0.5, k * score_std ** 0.5, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_agreement_passes_16_bit_and_catches_swapped_heads(dtype) -> None:
    from helpers.model.attention import agreement_tolerance, attention_agreement

    q, k, v = _spread_qkv()
    ref = sdpa_attention(q, k, v, backend="math")
    tol = agreement_tolerance(dtype)
    for fn in (naive_attention, tiled_attention, sdpa_attention):
        out = fn(q.to(dtype), k.to(dtype), v.to(dtype))
        assert attention_agreement(out, ref) < tol, fn.__name__
        swapped = out[:, [1, 0, 2, 3]]  # heads 0 and 1 exchanged: a reshape bug
        assert attention_agreement(swapped, ref) > 20 * tol, fn.__name__
    one_row = ref.clone()
    one_row[0, 2, 5] += ref[0, 2].norm(dim=-1).mean()  # a single query row wrong by a typical row norm
    assert attention_agreement(one_row, ref) > tol  # 1/√N = 0.06 of the head's norm at N=256


def test_agreement_is_relative_and_checks_its_inputs() -> None:
    from helpers.model.attention import agreement_tolerance, attention_agreement

    q, k, v = _spread_qkv(n=32)
    ref = sdpa_attention(q, k, v)
    assert attention_agreement(ref, ref) == 0.0
    assert attention_agreement(ref * 1e-6 * 1.01, ref * 1e-6) == pytest.approx(0.01)  # scale does not matter
    with pytest.raises(ValueError, match="one shape"):
        attention_agreement(ref, ref[:, :2])
    with pytest.raises(ValueError, match="all zeros"):
        attention_agreement(ref, torch.zeros_like(ref))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        agreement_tolerance(torch.int8)
    assert agreement_tolerance(torch.float32, "cuda") > agreement_tolerance(torch.float32, "cpu")


def test_maps_and_saving_go_through_a_stacks_wrappers(minilm, tmp_path) -> None:
    """Lesson 08's final cells take whatever stack the ladder kept: packing wraps the model in a PackedModel
    (its forward takes packed batches only), torch.compile in an OptimizedModule."""
    import copy

    from helpers.model.packed_model import base_model
    from helpers.train.runspec import RunSpec

    model, tok = minilm
    text = "Attention maps show where each token looks."
    plain = capture_attention_maps(model, tok, text, verbose=False)
    packed = RunSpec(attn="sdpa", padding="packed").apply(copy.deepcopy(model))
    assert base_model(packed) is packed.model and base_model(model) is model
    compiled_then_packed = type(packed)(torch.compile(model))  # whole-model compile, then packing
    assert base_model(compiled_then_packed) is model  # compiled lazily: nothing is compiled here
    maps = capture_attention_maps(packed, tok, text, verbose=False)  # not a packed batch: the model inside
    torch.testing.assert_close(maps.maps, plain.maps, atol=0, rtol=0)
    base_model(packed).save_pretrained(tmp_path)  # what lesson 08 saves: Hugging Face's files, no wrapper
    assert (tmp_path / "config.json").exists() and not hasattr(packed, "save_pretrained")
    assert set(base_model(packed).state_dict()) == set(model.state_dict())  # loads into a plain copy
