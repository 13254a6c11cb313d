"""helpers.core.compat: each version-dependent call takes the path of the version installed, and refuses what
that version cannot do with the version needed. Older versions are simulated by `version_of`; the real
old sets run under `make test-matrix`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from helpers.core import compat


def _pretend(monkeypatch: pytest.MonkeyPatch, **versions: str) -> None:
    """Make compat see other installed versions (package=version; '_' for '-')."""
    real = compat.version_of
    monkeypatch.setattr(compat, "version_of", lambda name: versions.get(name.replace("-", "_"), real(name)))


def _bert(attn: str = "sdpa") -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, num_labels=3, attn_implementation=attn)
    return BertForSequenceClassification(cfg)


def test_triton_interpreter_refuses_numpy_2_4_before_triton_3_7(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, numpy="2.4.1", triton="3.6.0")
    with pytest.raises(RuntimeError, match=r"triton 3\.6\.0 fails with numpy 2\.4\.1.*3\.7 or numpy < 2\.4"):
        compat.check_triton_interpreter()
    _pretend(monkeypatch, numpy="2.4.1", triton="3.7.0")
    compat.check_triton_interpreter()  # fixed in 3.7
    _pretend(monkeypatch, numpy="2.3.5", triton="3.3.1")
    compat.check_triton_interpreter()


def test_switch_on_transformers_4_rebuilds_with_the_same_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _bert("sdpa").train()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    ids = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    _pretend(monkeypatch, transformers="4.52.4")
    eager = compat.set_attn_implementation(model, "eager")
    assert eager is not model and eager.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"  # the original is left as it was
    assert eager.training and not eager.bert.embeddings.word_embeddings.weight.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(eager.eval()(ids).logits, model.eval()(ids).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match=r"'flex_attention' for a BERT model needs transformers >= 5\.0"):
        compat.set_attn_implementation(model, "flex_attention")
    monkeypatch.undo()
    if compat.at_least("transformers", compat.TRANSFORMERS_V5):  # the real 5.x switches in place
        assert compat.set_attn_implementation(model, "eager") is model


def test_dropout_off_reaches_4x_sdpa_and_survives_a_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _bert("eager")
    for module in model.bert.encoder.layer[0].attention.self.modules():
        module.dropout_prob = 0.1  # what transformers 4.x SDPA attention keeps (from the config)
    compat.disable_dropout(model)
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.bert.encoder.layer[0].attention.self.dropout_prob == 0
    _pretend(monkeypatch, transformers="4.52.4")
    sdpa = compat.set_attn_implementation(model, "sdpa")
    attention = [m for m in sdpa.modules() if hasattr(m, "dropout_prob")]
    assert all(m.dropout_prob == 0 for m in attention)  # 4.x SDPA modules get the old modules' rate


def test_packing_mask_takes_each_transformers_form(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = torch.tensor([[0, 0, 1]])  # one row: a document of 2 tokens, then one of 1
    same = (doc[:, :, None] == doc[:, None, :])[:, None]  # (1, 1, 3, 3)
    _pretend(monkeypatch, transformers="5.17.0")
    assert compat.packing_attention_mask(same, "sdpa", torch.float32).dtype == torch.bool
    eager = compat.packing_attention_mask(same, "eager", torch.float32)
    assert eager.shape == (1, 1, 3, 3) and eager[0, 0, 0, 2] == torch.finfo(torch.float32).min
    _pretend(monkeypatch, transformers="4.52.4")
    old = compat.packing_attention_mask(same, "sdpa", torch.float32)
    assert old.shape == (1, 3, 3) and old.tolist() == [[[1, 1, 0], [1, 1, 0], [0, 0, 1]]]


def test_flex_and_fsdp_refusals_name_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, torch="2.7.1")
    ok, why = compat.flex_compiles("cpu")
    assert not ok and "needs torch >= 2.11" in why
    assert compat.flex_compiles("cuda")[0] and compat.flex_trains("cpu")[0]
    _pretend(monkeypatch, torch="2.11.0")
    ok, why = compat.flex_trains("cpu")
    assert not ok and "no backward pass on a CPU" in why and compat.flex_trains("cuda")[0]
    _pretend(monkeypatch, torch="2.5.1")
    with pytest.raises(RuntimeError, match=r"fully_shard\) needs torch >= 2\.6"):
        compat.fully_shard()


# --- the one reader of each private torch attribute, and the accessors the rest of the course calls ------

def test_unwrap_model_sees_through_compile_and_data_parallel_only() -> None:
    inner = torch.nn.Linear(2, 2)
    compiled_like = torch.nn.Module()
    compiled_like._orig_mod = torch.nn.DataParallel(inner)  # torch.compile's attribute, around DP
    assert compat.unwrap_model(compiled_like) is inner
    holder = torch.nn.Module()
    holder.module = inner  # a plain submodule called `module` is not a wrapper: left alone
    assert compat.unwrap_model(holder) is holder


def test_version_tuple_compares_as_numbers() -> None:
    assert compat.version_tuple("2.13.0+cpu") == (2, 13, 0) and compat.version_tuple("12.4") == (12, 4)
    assert compat.version_tuple("2.10.0") > compat.version_tuple("2.9.1")  # as numbers, not as text


def test_attention_only_dropout_leaves_the_rest_and_refuses_a_model_without_it() -> None:
    model = compat.disable_dropout(_bert("eager"), attention_only=True)
    assert model.config.attention_probs_dropout_prob == 0 and model.bert.embeddings.dropout.p > 0
    assert all(layer.attention.self.dropout.p == 0 for layer in model.bert.encoder.layer)
    with pytest.raises(ValueError, match="no attention.self dropout"):
        compat.disable_dropout(torch.nn.Sequential(torch.nn.Dropout(0.1)), attention_only=True)


def test_grad_scaler_scale_is_a_copy_and_none_when_disabled() -> None:
    assert compat.grad_scaler_scale(None) is None
    assert compat.grad_scaler_scale(torch.amp.GradScaler("cpu", enabled=False)) is None
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert float(compat.grad_scaler_scale(scaler)) == 8.0  # before the first step: get_scale()'s value
    scaler.scale(torch.ones(()))  # the scale now lives on the device as a tensor
    got = compat.grad_scaler_scale(scaler)
    got.mul_(2)
    assert float(got) == 16.0 and scaler.get_scale() == 8.0  # a copy: the scaler's own is unchanged


def test_tf32_settings_round_trip() -> None:
    before = compat.tf32_settings()
    try:
        compat.set_tf32_settings("high", False)
        assert compat.tf32_settings() == ("high", False) and compat.tf32_matmul_enabled()
        compat.set_tf32_settings(None, True)  # None: the default, exact float32
        assert compat.tf32_settings() == ("highest", True) and not compat.tf32_matmul_enabled()
    finally:
        compat.set_tf32_settings(*before)
    assert compat.tf32_settings() == before


def test_profiler_enabled_follows_a_running_profiler() -> None:
    assert not compat.profiler_enabled()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert compat.profiler_enabled()
    assert not compat.profiler_enabled()


def test_make_adamw_falls_back_where_the_fused_kernel_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    assert compat.make_adamw(params, 1e-3, fused=True).defaults["fused"]
    real = torch.optim.AdamW

    def no_fused(groups, lr, fused=None):  # an older torch: no fused kernel for this device
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of "
                               "supported devices")
        return real(groups, lr=lr)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    assert not compat.make_adamw(params, 1e-3, fused=True).defaults["fused"]


def test_hf_activation_checkpointing_uses_the_name_of_the_installed_transformers() -> None:
    model = _bert("eager")
    # transformers 5.x names it activation_checkpointing, 4.x gradient_checkpointing
    prefix = "activation" if hasattr(type(model), "activation_checkpointing_enable") else "gradient"
    compat.hf_activation_checkpointing(model, True)
    assert getattr(model, f"is_{prefix}_checkpointing")
    compat.hf_activation_checkpointing(model, False)
    assert not getattr(model, f"is_{prefix}_checkpointing")
    with pytest.raises(ValueError, match="no Hugging Face checkpointing switch"):
        compat.hf_activation_checkpointing(torch.nn.Linear(2, 2), True)


def test_triton_below_3_4_is_refused_for_gpus_before_sm80(monkeypatch):
    """triton 3.3 fails every fp16 tl.dot for sm_75 (triton-lang/triton#6698): the kernel is refused there
    with the fix, and nothing changes from sm_80 on or with triton >= 3.4."""
    from helpers.model.kernels import configs

    monkeypatch.setattr(compat, "version_of", lambda name: "3.3.1" if name == "triton" else "99")
    ok, why = compat.triton_compiles_for((7, 5))
    assert not ok and "triton>=3.4" in why and "6698" in why
    assert configs.gpu_refusal((7, 5), torch.float16, 128) == why
    assert compat.triton_compiles_for((8, 0)) == (True, "")
    monkeypatch.setattr(compat, "version_of", lambda name: "3.4.0")
    assert compat.triton_compiles_for((7, 5)) == (True, "")
    assert configs.gpu_refusal((7, 5), torch.float16, 128) is None


def test_exit_now_keeps_what_a_normal_exit_keeps(tmp_path: Path) -> None:
    """exit_now (the last line of the launched scripts) runs the exit handlers and flushes what the process
    printed or logged before it leaves, with the code it was given."""
    marker = tmp_path / "atexit.txt"
    code = textwrap.dedent(f"""
        import atexit, logging, pathlib, sys
        from helpers.core.compat import exit_now
        atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("ran"))
        logging.basicConfig(stream=sys.stderr, level=logging.INFO)
        sys.stdout = open(sys.stdout.fileno(), "w", buffering=1 << 16, closefd=False)  # held until a flush
        print("printed, unflushed", end="")
        logging.getLogger("course").info("logged")
        exit_now(3)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(compat.__file__).resolve().parents[1])
    assert done.returncode == 3, done.stderr
    assert done.stdout == "printed, unflushed" and "logged" in done.stderr
    assert marker.read_text() == "ran"


def test_guard_kind_names_what_each_guard_checks() -> None:
    """Lesson 05 prints each Dynamo guard with what it checks: the tensor arguments' guards are TENSOR_MATCH
    on every supported torch, asked through `create_fn_name()` where torch has it (2.13) and through the
    builder function itself where it has not (2.7)."""
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    guards = [g for g in compat.explain_graphs(double, torch.ones(3)).out_guards if g.name]
    kinds = {g.name: compat.guard_kind(g) for g in guards}
    assert kinds.get("L['x']") == "TENSOR_MATCH", kinds
    for g in guards:
        if hasattr(g, "create_fn_name"):  # torch 2.13: the method the lesson called before
            assert compat.guard_kind(g) == g.create_fn_name()
    planted = SimpleNamespace(inner_create_fn=lambda: double)  # a guard of torch 2.7's shape
    assert compat.guard_kind(planted) == "double"


def test_all_reduce_takes_avg_on_every_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lesson 07's check runs a learner's all-reduce through `all_reduce_with_avg`: where gloo has no
    ReduceOp.AVG (torch 2.7 raises, 2.8 on averages: `all_reduce_averages` says which, checked here against
    this torch's gloo), AVG runs as a sum divided by the group's size, once, when the call or its handle or
    future is done. A one-process gloo group, said to be of 2 for the division (its sum is the tensor itself:
    an AVG left undivided would read 4, not 2)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        raw = torch.ones(3)
        try:
            dist.all_reduce(raw, op=dist.ReduceOp.AVG)
            gloo_avg = True
        except RuntimeError as err:
            assert "Cannot use ReduceOp.AVG with Gloo" in str(err)
            gloo_avg = False
        assert compat.all_reduce_averages("gloo") == gloo_avg == compat.at_least("torch", compat.GLOO_AVG)
        assert compat.all_reduce_averages("nccl")
        avg = compat.all_reduce_with_avg(dist.all_reduce)
        t = torch.full((3,), 4.0)
        avg(t, op=dist.ReduceOp.AVG)  # a world of one: the average is the tensor, on every torch
        assert t.tolist() == [4.0] * 3
        monkeypatch.setattr(compat, "all_reduce_averages", lambda backend: False)  # gloo as in torch 2.7
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        sync, waited, future, summed = (torch.full((3,), 4.0) for _ in range(4))
        avg(sync, op=dist.ReduceOp.AVG)
        handle = avg(waited, op=dist.ReduceOp.AVG, async_op=True)
        handle.wait()
        handle.get_future().wait()  # waited twice: divided once
        avg(future, op=dist.ReduceOp.AVG, async_op=True).get_future().wait()
        avg(summed, async_op=True).wait()  # SUM, the default: as it was
        assert [x.tolist() for x in (sync, waited, future, summed)] == [[2.0] * 3] * 3 + [[4.0] * 3]
    finally:
        dist.destroy_process_group()
