"""The helpers on a model of one's own (issue 33): a GPT written the common way (tests/owngpt.py: its own
config, its own attention, forward(idx, targets) -> (logits, loss), (x, y) batches) and a Hugging Face GPT-2
built from a config go through train, RunSpec, MFU, the memory estimate, profile_step and the greedy ladder
with `helpers.core.adapt.as_course_model` and nothing of the test's own. Each numbered test fails on the code
before issue 33 (its point named)."""

from __future__ import annotations

import copy

import pytest
import torch
from owngpt import GPT, GPTConfig, OddConfig, OddGPT, batches
from torch.nn import functional as F

from helpers.core.adapt import CourseModel, ModelShape, as_batch, as_course_model
from helpers.measure.agreement import TOLERANCES
from helpers.measure.memory import estimate_training_memory, tensor_bytes, track_peak_memory
from helpers.train import ladder
from helpers.train.loop import TrainConfig, make_optimizer, train
from helpers.train.runspec import RunSpec

CPU = torch.device("cpu")
QUIET = dict(progress=False, peak_flops=1e11)


def _gpt(dropout: float = 0.0, seed: int = 0) -> tuple[GPT, GPTConfig]:
    cfg = GPTConfig(dropout=dropout)
    torch.manual_seed(seed)
    return GPT(cfg), cfg


# --- point 3: the model contract, helped -------------------------------------------------------------------

def test_3_a_model_of_ones_own_trains_on_xy_batches_once_wrapped():
    gpt, cfg = _gpt()
    data = batches(cfg, 4)
    with pytest.raises(ValueError, match="as_course_model"):  # before: forward() got 'input_ids'
        train(copy.deepcopy(gpt), data, TrainConfig(steps=2, **QUIET))
    result = train(as_course_model(copy.deepcopy(gpt)), data, TrainConfig(steps=8, lr=3e-3, **QUIET))
    assert result.losses[-1] < result.losses[0] - 0.1  # it learns the shifted sequence
    # the same run, the model returning logits only and the loss given: identical losses
    class LogitsOnly(GPT):
        def forward(self, idx, targets=None):
            return super().forward(idx)[0]

    logits_only = LogitsOnly(cfg)
    logits_only.load_state_dict(gpt.state_dict())
    same = train(as_course_model(logits_only, loss_fn=F.cross_entropy), data,
                 TrainConfig(steps=8, lr=3e-3, **QUIET))
    assert same.losses == pytest.approx(result.losses, rel=1e-5)
    # (x, y) pairs reach a model of the course's contract too (before: 'tuple' object has no attribute 'get')
    from helpers.model.models import SmallTransformer, TransformerConfig

    small = SmallTransformer(TransformerConfig(vocab_size=cfg.vocab_size, max_len=cfg.block_size, d_model=32,
                                               n_heads=2, n_layers=1, d_ff=64))
    assert as_course_model(small) is small
    assert train(small, data, TrainConfig(steps=3, **QUIET)).tokens_per_s > 0  # step 2 reads the memory
    with pytest.raises(ValueError, match="one .x, y. pair"):
        train(as_course_model(gpt), data[0], TrainConfig(steps=1, **QUIET))


def test_the_adapter_reads_every_common_return_and_refuses_what_it_cannot_pass():
    gpt, cfg = _gpt()
    x, y = batches(cfg, 1)[0]
    logits, loss = gpt(x, y)
    for returned, want in ((loss, (None, loss)), ((logits, loss), (logits, loss)), (logits, (logits, None)),
                           ({"loss": loss, "logits": logits}, (logits, loss))):
        out = CourseModel(_Returns(returned))(x, y)
        assert (out.logits, out.loss) == want
    assert as_batch((x, y)) == {"input_ids": x, "labels": y}
    with pytest.raises(ValueError, match="attention_mask.*does not take"):  # a dropped mask changes the sums
        as_course_model(gpt)(x, y, attention_mask=torch.ones_like(x))
    with pytest.raises(ValueError, match="a batch is a dict"):
        as_batch([x])


class _Returns(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x, y=None):
        return self.value


# --- point 4: a None says why ------------------------------------------------------------------------------

def test_4_mfu_left_out_says_why_and_a_shape_told_once_brings_it_back(capsys):
    odd, cfg = OddGPT(OddConfig()), GPTConfig()
    data = batches(cfg, 2)
    result = train(as_course_model(odd), data, TrainConfig(steps=3, **QUIET))
    assert result.mfu is None and "set_model_shape" in result.notes["flops_per_token"]
    assert "mfu" in result.notes
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: ")]
    assert len(printed) == 1 and "mfu is None" in printed[0]  # one line, every reason
    told = as_course_model(odd, shape=ModelShape(n_layers=2, n_heads=2, head_dim=16))
    result = train(told, data, TrainConfig(steps=3, track_memory=False, **QUIET))
    n = sum(p.numel() for m in odd.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())
    per_token = 6 * n + 12 * 2 * 2 * 16 * cfg.block_size  # PaLM's formula, the model's own sizes
    assert result.flops_per_token == pytest.approx(per_token)
    assert result.mfu == pytest.approx(result.tokens_per_s * per_token / 1e11)
    assert set(result.notes) == {"peak_memory_bytes"}
    assert "track_memory=False" in result.notes["peak_memory_bytes"]


def test_the_flop_counter_reads_a_config_or_the_attention_modules():
    from helpers.measure.flops import model_shape

    gpt, _ = _gpt()
    assert model_shape(as_course_model(gpt)) == ModelShape(2, 2, 16)  # nanoGPT's names in its config
    del gpt.config
    assert model_shape(as_course_model(gpt)) == ModelShape(2, 2, 16)  # one attention module per layer
    with pytest.raises(ValueError, match="set_model_shape"):
        model_shape(OddGPT(OddConfig()))


# --- point 5: RunSpec(attn=...) names the fix --------------------------------------------------------------

def test_5_an_attention_switch_on_attention_of_ones_own_names_attn_none():
    model = as_course_model(_gpt()[0])
    with pytest.raises(ValueError, match="attn=None"):  # before: TypeError, needs a Hugging Face model
        RunSpec(attn="sdpa").apply(model)
    with pytest.raises(ValueError, match="padding='bucketed'"):
        RunSpec(padding="packed").check_model(model)
    RunSpec(attn=None, precision="bf16").check_model(model)  # the model's own attention: fine


# --- point 2: FSDP2 and train's memory tracking ------------------------------------------------------------

def test_2_fsdp2_train_tracks_memory_of_its_shards_on_a_cpu():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from helpers.core import compat
    from helpers.data.synthetic import synthetic_batch_fn
    from helpers.model.models import SmallTransformer, TransformerConfig

    cfg = TransformerConfig(vocab_size=64, max_len=16, d_model=32, n_heads=2, n_layers=2, d_ff=64)
    plain = SmallTransformer(cfg)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = copy.deepcopy(plain)
        mesh = init_device_mesh("cpu", (1,))
        for block in model.blocks:
            compat.fully_shard()(block, mesh=mesh)
        compat.fully_shard()(model, mesh=mesh)
        assert tensor_bytes(model) == tensor_bytes(plain)  # one rank holds every shard: the same bytes
        result = train(model, synthetic_batch_fn(64, 4, 16, seed=0), TrainConfig(steps=2, **QUIET))
    finally:
        dist.destroy_process_group()
    assert result.peak_memory_bytes > 4 * tensor_bytes(plain)  # weights, gradients, two moments, activations


# --- points 1, 6, 7: the ladder on any model ---------------------------------------------------------------

def test_7_random_batches_fit_a_small_vocabulary():
    batches_, check = ladder.sample_batches([5, 9, 12, 7], batch_size=2, n_batches=2, seq_len=16, vocab=96,
                                            n_classes=2)
    ids = torch.cat([b["input_ids"].flatten() for b in batches_["fixed"]])
    assert 0 <= int(ids.min()) and int(ids.max()) < 96  # before: randint(1000, 96) failed
    big, _ = ladder.sample_batches([5, 9, 12, 7], batch_size=2, n_batches=2, seq_len=16, vocab=30522,
                                   n_classes=2)
    real = torch.cat([b["input_ids"][b["attention_mask"].bool()] for b in big["fixed"]])
    assert int(real.min()) >= ladder.FIRST_WORD_ID  # a BERT vocabulary's special ids stay out


def test_6_dropout_is_off_for_the_check_and_on_for_the_timed_passes(monkeypatch):
    # a Hugging Face BERT with its dropout on, as from_pretrained gives it: before, every rung "disagreed"
    from torch import nn
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(num_hidden_layers=1, hidden_size=32,
                                                    num_attention_heads=2, intermediate_size=64,
                                                    vocab_size=2000)).train()
    assert bert.config.hidden_dropout_prob > 0
    batches_, check = ladder.sample_batches([9, 16, 12, 7], batch_size=2, n_batches=1, seq_len=16, vocab=2000,
                                            n_classes=2)
    kw = dict(make_model=lambda: copy.deepcopy(bert), batches=batches_, check=check, device=CPU, repeats=1)
    base = ladder.measure_stack(ladder.BASELINE, None, **kw)
    arm = ladder.measure_stack(ladder.BASELINE.replace(precision="tf32"), base, **kw)
    assert "≤" in arm.row["check_logits"] and arm.row["check_mode"].startswith("eval")
    # planted: dropout that ignores model.eval() (its modules stay in training mode): the check disagrees,
    # and names dropout as the cause
    monkeypatch.setattr(nn.Dropout, "train", lambda self, mode=True: self)
    with pytest.raises(ladder.RungDisagrees, match="dropout"):
        ladder.measure_stack(ladder.BASELINE.replace(precision="tf32"),
                             ladder.measure_stack(ladder.BASELINE, None, **kw), **kw)


def test_1_the_greedy_ladder_climbs_a_model_of_ones_own():
    gpt, cfg = _gpt(dropout=0.1, seed=1)  # dropout on, a vocabulary of 96, attention of its own
    data = batches(cfg, 2)
    rungs = [r for r in ladder.RUNGS if r.switch in ("precision", "attn", "fused_adamw", "padding", "fp8")]
    out = ladder.climb_stacks(lambda: as_course_model(copy.deepcopy(gpt)), {"fixed": data},
                              {"fixed": data[0]}, device=CPU, repeats=2, rungs=rungs, peak_flops=1e11,
                              log=lambda s: None)
    rows = {r["name"]: r for r in out["rows"]}
    assert rows["fp32 eager (baseline)"]["attn"] is None  # the model's own attention, left alone
    timed = [r for r in out["rows"] if "samples_per_s" in r]
    assert {r["name"] for r in timed} == {"fp32 eager (baseline)", "+ bf16 autocast", "+ fused AdamW"}
    assert "no TF32 units" in rows["+ TF32"]["skipped"]  # a CPU: the same fp32 matmuls, nothing to time
    assert all("≤" in r["check_loss"] and "≤" in r["check_logits"] for r in timed[1:])  # dropout off to check
    assert all(r["mfu"] > 0 for r in timed)
    assert "attn=None" in rows["+ SDPA"]["skipped"]
    assert "batches['bucketed']" in rows["+ length bucketing"]["skipped"]
    assert "packed forward" in rows["+ packing"]["skipped"]
    assert out["stack"].attn is None and out["stack"].padding == "fixed"
    assert set(rows["fp32 eager (baseline)"]["notes"]) == {"peak_memory_bytes"}  # on a CPU: why None


def test_a_plan_names_what_a_model_and_a_device_cannot_run(monkeypatch):
    from fakegpu import fake_gpu

    gpt = as_course_model(_gpt()[0])
    skipped = {p["name"]: p["skipped"] for p in ladder.plan_rungs(CPU, model=gpt, paddings=["fixed"])}
    assert "no TF32 units" in skipped["+ TF32"] and "attn=None" in skipped["+ SDPA"]
    assert skipped["+ bf16 autocast"] is None
    fake_gpu(monkeypatch, "T4")  # compute capability 7.5: fp16 is its 16-bit rung, bf16 is not
    skipped = {p["name"]: p["skipped"] for p in ladder.plan_rungs("cuda")}
    assert skipped["+ fp16 autocast + GradScaler"] is None and "use fp16" in skipped["+ bf16 autocast"]
    fake_gpu(monkeypatch, "A100-40")
    skipped = {p["name"]: p["skipped"] for p in ladder.plan_rungs("cuda")}
    assert skipped["+ bf16 autocast"] is None
    assert "bf16 tensor cores" in skipped["+ fp16 autocast + GradScaler"]


def test_the_fp16_rung_trains_with_a_grad_scaler():
    gpt, cfg = _gpt()
    data = batches(cfg, 2)
    kw = dict(make_model=lambda: as_course_model(copy.deepcopy(gpt)), batches={"fixed": data},
              check={"fixed": data[0]}, device=CPU, repeats=1)
    base = ladder.measure_stack(ladder.BASELINE.replace(attn=None), None, **kw)
    fp16 = ladder.measure_stack(ladder.BASELINE.replace(attn=None, precision="fp16"), base, **kw)
    assert "≤" in fp16.row["check_loss"] and "fp16" in TOLERANCES
    steps = []
    from torch.amp import GradScaler

    original = GradScaler.step
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GradScaler, "step", lambda self, opt, *a, **k: steps.append(self.is_enabled())
                   or original(self, opt, *a, **k))
        fp16.run()
    assert steps and all(steps)  # every optimizer step of an fp16 pass goes through the enabled scaler


# --- the done-when: RunSpec, profile_step, and the memory estimate ---------------------------------------

def test_runspec_switches_and_profile_step_take_a_model_of_ones_own():
    from helpers.measure.opcount import labelled_step
    from helpers.measure.regimes import profile_step
    from helpers.measure.roofline import Roofline

    gpt, cfg = _gpt()
    data = batches(cfg, 2)
    spec = RunSpec(precision="bf16", fused_adamw=True)
    model = spec.apply(as_course_model(copy.deepcopy(gpt)))
    result = train(model, data, TrainConfig(steps=3, **QUIET), spec=spec)  # step 2 reads the memory
    assert result.mfu > 0 and len(result.losses) == 3
    model = as_course_model(copy.deepcopy(gpt))
    step = labelled_step(model, as_batch(data[0]), make_optimizer(model, 1e-3, 0.01))
    table = profile_step(step, Roofline("test", {"fp32": 100e9}, 10e9, 512, 2**20), overhead_s=1e-5, steps=1)
    assert {r.phase for r in table.rows} >= {"forward", "backward"} and sum(r.flops for r in table.rows) > 0


def test_compile_is_regional_on_a_model_of_ones_own(monkeypatch):
    # which modules RunSpec(compile=True) compiles (Inductor itself runs in lessons 05 and 08: a first compile
    # costs 20 s to minutes on a loaded 2-core CPU); here each compile() is recorded and the model runs eager
    gpt, cfg = _gpt()
    wrapped = as_course_model(copy.deepcopy(gpt))
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(self))
    spec = RunSpec(compile=True)
    model = spec.apply(wrapped)
    assert model is wrapped and compiled == list(wrapped.model.transformer.h)  # nanoGPT's blocks, one by one
    assert train(model, batches(cfg, 2), TrainConfig(steps=3, **QUIET), spec=spec).tokens_per_s > 0
    flat = torch.nn.Sequential(torch.nn.Linear(2, 2))  # no list of blocks: compiled whole
    compiled_whole = RunSpec(compile=True).apply(as_course_model(flat, loss_fn=F.mse_loss))
    assert type(compiled_whole).__name__ == "OptimizedModule"


def _measured_peak(model: torch.nn.Module, batch: dict) -> int:
    """The fp32 peak of a training step on this CPU (the profiler's memory events, the weights as baseline),
    after a first step that made the optimizer's state."""
    model = copy.deepcopy(model).train()
    opt = make_optimizer(model, 1e-3, 0.01, fused=True)

    def step():
        opt.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        opt.step()

    step()
    with track_peak_memory(CPU, baseline_bytes=tensor_bytes(model, opt, *batch.values())) as report:
        step()
    return report.peak_bytes


def test_8_the_dry_run_estimates_any_model_within_15_percent_of_the_measured_peak():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt, cfg = _gpt()
    x, y = batches(cfg, 1, batch_size=8)[0]
    own = as_course_model(gpt)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                      bos_token_id=0, eos_token_id=0)).train()
    ids = torch.randint(500, (8, 64))
    for model, batch in ((own, as_batch((x, y))), (gpt2, {"input_ids": ids, "labels": ids})):
        est = estimate_training_memory(model, *batch["input_ids"].shape, batch=batch)
        measured = _measured_peak(model, batch)
        assert est.method == "dry run" and est.assumes
        assert abs(est.peak / measured - 1) <= 0.15, (type(model).__name__, est.peak, measured)
    # the formula is the course's model only, and says what it assumes
    with pytest.raises(ValueError, match="method='dry run'"):
        estimate_training_memory(gpt2, 8, 64, method="formula")


def test_a_hugging_face_gpt2_from_a_config_takes_the_same_path():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="eager"))
    assert as_course_model(gpt2) is gpt2  # it follows the contract already
    data = [(x, x) for x, _ in batches(GPTConfig(), 2)]  # GPT-2 shifts the labels itself
    result = train(copy.deepcopy(gpt2), data, TrainConfig(steps=3, **QUIET))
    assert result.mfu > 0 and result.flops_per_token > 0
    rungs = [r for r in ladder.RUNGS if r.switch == "attn"]
    out = ladder.climb_stacks(lambda: copy.deepcopy(gpt2), {"fixed": data}, {"fixed": data[0]}, device=CPU,
                              repeats=1, rungs=rungs, peak_flops=1e11, log=lambda s: None)
    baseline, sdpa = out["rows"]
    assert baseline["attn"] == "eager" and "≤" in sdpa["check_logits"]  # a HF model: its attention switched
