"""helpers.train.runspec (issue 19): one frozen RunSpec is the one home of a run's switches: its step context
(TF32) covers forward, backward and step, its autocast forward and loss only; its dataloader builds every
padding (and pins for a GPU); apply and describe.
A source test checks that no other code applies the TF32/autocast switches or computes MFU."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.core import compat
from helpers.core.precision import tf32_enabled
from helpers.data.synthetic import synthetic_batch_fn
from helpers.data.text import TokenizedDataset
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.loop import TrainConfig, train
from helpers.train.runspec import ATTNS, PADDINGS, RunSpec

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [5, 9, 3, 12, 7, 4]


def _dataset() -> TokenizedDataset:
    return TokenizedDataset([list(range(1, n + 1)) for n in LENGTHS], [i % 2 for i in range(len(LENGTHS))])


def test_bad_switches_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"RunSpec.precision='fp8'.*fp8=True"):
        RunSpec(precision="fp8")
    with pytest.raises(ValueError, match="RunSpec.padding='packing'"):
        RunSpec(padding="packing")
    with pytest.raises(ValueError, match="RunSpec.attn"):
        RunSpec(attn="flash")
    with pytest.raises(ValueError, match="RunSpec.compile must be True or False"):
        RunSpec(compile=1)
    with pytest.raises(ValueError, match="init_scale"):
        RunSpec(init_scale=0.0)
    with pytest.raises(ValueError, match="padding='packed'"):
        RunSpec(attn="varlen", precision="bf16")  # varlen attends within packed documents only
    with pytest.raises(ValueError, match="bf16 or fp16"):
        RunSpec(attn="varlen", padding="packed")  # FlashAttention needs half-precision activations
    with pytest.raises(dataclass_frozen_error()):
        RunSpec().precision = "bf16"  # frozen: a run's switches do not change under it


def test_the_choices_are_literal_types_the_lists_derive_from():
    from typing import get_args

    from helpers.core.precision import PRECISIONS, Precision
    from helpers.data.text import PAD_MODES as DATA_PADDINGS
    from helpers.train.runspec import Attn, Padding

    assert PADDINGS == get_args(Padding) and ATTNS == get_args(Attn) and PRECISIONS == get_args(Precision)
    assert set(PADDINGS) == {*DATA_PADDINGS, "packed"}  # the data layer's paddings, and packing
    assert set(ATTNS) == {"eager", "sdpa", "flex", "varlen"}


def fields_without_help(cls: type) -> list[str]:
    """The fields of dataclass `cls` with no non-empty `metadata={"help": ...}` (what --help prints)."""
    import dataclasses

    return [f.name for f in dataclasses.fields(cls) if not str(f.metadata.get("help") or "").strip()]


def test_every_switch_says_what_it_does():
    import dataclasses

    assert fields_without_help(RunSpec) == []  # a new switch must say what it does and needs
    planted = dataclasses.make_dataclass("Planted", [("x", int, dataclasses.field(default=0)),
                                                     ("y", int, dataclasses.field(default=0,
                                                                                  metadata={"help": " "}))])
    assert fields_without_help(planted) == ["x", "y"]


def test_the_flags_show_each_switch_s_help():
    import dataclasses

    from helpers.train.runspec import flag_parser, spec_flags

    text = " ".join(flag_parser(spec_flags()).format_help().split())  # argparse wraps the lines
    for f in dataclasses.fields(RunSpec):
        assert " ".join(f.metadata["help"].split()) in text, f"--help does not show RunSpec.{f.name}'s help"
        assert f"RunSpec.{f.name} (default" not in text  # the bare placeholder: for a field with no help


def test_check_covers_every_switch(monkeypatch):
    RunSpec(attn="sdpa", compile=True, padding="packed", activation_checkpointing=True).check("cpu")
    refused = {
        "fp8=True": RunSpec(fp8=True),  # no FP8 units on a CPU
        "attn='flex'": RunSpec(attn="flex"),  # no FlexAttention backward on a CPU (torch >= 2.11)
        "attn='varlen'": RunSpec(attn="varlen", precision="bf16", padding="packed"),  # CUDA only
        "fused_adamw=True": RunSpec(),  # on a device torch has no fused AdamW for
        "no CUDA GPU": RunSpec(precision="bf16"),
    }
    for match, spec in refused.items():
        device = {"fused_adamw=True": "meta", "no CUDA GPU": "cuda"}.get(match, "cpu")
        if device == "cuda" and torch.cuda.is_available():
            continue
        if match == "attn='flex'" and compat.flex_trains("cpu")[0]:
            continue  # an older torch trains FlexAttention on a CPU
        with pytest.raises(ValueError, match=re.escape(match)):
            spec.check(device)
    RunSpec(fused_adamw=False).check("meta")
    monkeypatch.setattr("shutil.which", lambda name: None)  # no C++ compiler for Inductor's CPU kernels
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ValueError, match="compile=True.*C\\+\\+ compiler"):
        RunSpec(compile=True).check("cpu")


def test_the_spec_makes_the_grad_scaler():
    scaler = RunSpec(precision="fp16", init_scale=2.0 ** 10).make_scaler("cpu")
    assert scaler.is_enabled() and scaler.get_scale() == 2.0 ** 10
    assert not RunSpec(precision="bf16").make_scaler("cpu").is_enabled()


def test_a_script_nests_its_flags_into_one_spec():
    from helpers.train.runspec import flag_parser, spec_flags, spec_from_arguments

    p = flag_parser(spec_flags(("precision", "compile", "fused_adamw", "init_scale", "attn")))
    args = p.parse_args(["--precision", "bf16", "--compile", "--no-fused-adamw", "--init-scale", "1024"])
    assert spec_from_arguments(args) == RunSpec(precision="bf16", compile=True, fused_adamw=False,
                                                init_scale=1024.0)
    assert spec_from_arguments(p.parse_args([])) == RunSpec()  # attn's None ("the model's own") kept
    # both spellings of a bool whatever its default (HfArgumentParser's --no-x exists for a True default only)
    assert spec_from_arguments(p.parse_args(["--compile", "--no-compile"])).compile is False
    assert spec_from_arguments(p.parse_args(["--compile", "false"])).compile is False
    (switches,) = p.parse_args_into_dataclasses(["--attn", "sdpa"], look_for_args_file=False)
    assert spec_from_arguments(switches) == RunSpec(attn="sdpa")
    for wrong in (["--precision", "fp64"], ["--attn", "None"]):  # choices from the Literal types
        with pytest.raises(SystemExit):
            p.parse_args(wrong)
    with pytest.raises(ValueError, match="not a RunSpec field"):
        spec_flags(("precisoin",))


def test_hf_argument_parser_behaves_as_the_scripts_expect():
    # issue 31: the flags come from transformers.HfArgumentParser (the floor 4.52 and 5.x read the same
    # types the same way); what it lacks, --no-x for a bool whose default is False, flag_parser adds
    import dataclasses
    from typing import Literal, Optional

    from transformers import HfArgumentParser

    flags = dataclasses.make_dataclass("Flags", [("on", bool, True), ("off", bool, False),
                                                 ("mode", Optional[Literal["a", "b"]], None)])
    bare = HfArgumentParser(flags)
    assert vars(bare.parse_args(["--no-on", "--mode", "b"])) == {"on": False, "off": False, "mode": "b"}
    with pytest.raises(SystemExit):
        bare.parse_args(["--no-off"])  # the case flag_parser fills in


def dataclass_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_the_contexts_switch_tf32_and_autocast_by_one_rule_and_restore_them():
    seen = {}
    for spec in (RunSpec(), RunSpec(precision="tf32"), RunSpec(precision="bf16"), RunSpec(fp8=True)):
        with spec.step_context("cpu"):
            with spec.autocast("cpu"):
                inside = torch.is_autocast_enabled("cpu")
            seen[spec] = (tf32_enabled(), inside, torch.is_autocast_enabled("cpu"))
        assert not tf32_enabled() and not torch.is_autocast_enabled("cpu")
    # (TF32 in the step, autocast in the forward pass, autocast left on after the forward pass)
    assert list(seen.values()) == [(False, False, False), (True, False, False), (True, True, False),
                                   (True, True, False)]


def test_train_runs_the_backward_pass_and_the_step_with_the_specs_tf32():
    model = SmallTransformer(TransformerConfig(vocab_size=32, max_len=8, d_model=16, n_heads=2, n_layers=1))
    seen = []
    model.head.weight.register_hook(lambda g: seen.append(tf32_enabled()))
    train(model, synthetic_batch_fn(32, 2, 8), TrainConfig(steps=2, progress=False, track_memory=False),
          spec=RunSpec(precision="tf32"))
    assert seen == [True, True]


# --- A1: autocast covers forward + loss only, everywhere the course trains ----------------------------

class _Probe(torch.autograd.Function):
    """The identity, recording whether autocast is on where autograd runs its forward and its backward."""

    @staticmethod
    def forward(ctx, x, log):  # noqa: ANN001, ANN205 - autograd.Function's signature
        ctx.log = log
        log["forward"].append(torch.is_autocast_enabled("cpu"))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        ctx.log["backward"].append((torch.is_autocast_enabled("cpu"), tf32_enabled()))
        return grad, None


class _ProbeModel(torch.nn.Module):
    """A linear regressor with a probe after its matmul: `model(input_ids, labels).loss`."""

    def __init__(self, log) -> None:
        super().__init__()
        self.lin, self.log = torch.nn.Linear(8, 8), log

    def forward(self, input_ids, labels):  # noqa: ANN001, ANN201
        h = _Probe.apply(self.lin(input_ids.float()), self.log)  # bf16 under autocast
        return SimpleNamespace(loss=((h.float() - labels) ** 2).mean())


class _RecordingSGD(torch.optim.SGD):
    """SGD that records whether autocast (and TF32) are on while it steps."""

    def __init__(self, params, log) -> None:  # noqa: ANN001
        super().__init__(params, lr=0.1)
        self.log = log

    def step(self, closure=None):  # noqa: ANN001, ANN201
        self.log["step"].append((torch.is_autocast_enabled("cpu"), tf32_enabled()))
        return super().step(closure)


def _probe_batch(step: int = 0, micro: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 7 + micro)
    return {"input_ids": torch.randn(4, 8, generator=g), "labels": torch.randn(4, 8, generator=g)}


def _train_ddp_one_step(model, opt, spec) -> None:  # noqa: ANN001
    from course.scripts.train_ddp import one_step
    from helpers.train.distributed import DistEnv

    env = DistEnv(0, 0, 1, 1, torch.device("cpu"), "gloo", False)
    xs = [torch.randn(4, 8), torch.randn(4, 8)]  # the script calls model(x, labels=x)
    one_step(model, opt, xs, spec, env, no_sync=True)


@pytest.mark.parametrize("where", ["train", "TrainStep", "train_ddp"])
def test_autocast_covers_the_forward_pass_only_and_tf32_the_whole_step(where):
    # PyTorch's AMP guide: autocast wraps forward and loss; backward runs in the dtypes autocast chose for
    # the forward ops; optimizer.step() runs outside autocast. TF32, a global setting, covers the whole step.
    from helpers.train.loop import TrainStep

    log = {"forward": [], "backward": [], "step": []}
    model = _ProbeModel(log)
    opt = _RecordingSGD(model.parameters(), log)
    spec = RunSpec(precision="bf16")
    if where == "train":
        train(model, _probe_batch, TrainConfig(steps=2, grad_accum=2, progress=False, track_memory=False),
              device="cpu", spec=spec, optimizer=opt)
    elif where == "TrainStep":
        TrainStep(model, opt, spec=spec, device="cpu")([_probe_batch(0, 0), _probe_batch(0, 1)])
    else:
        _train_ddp_one_step(model, opt, spec)
    assert log["forward"] and all(log["forward"]), "the forward pass must run under autocast"
    assert log["backward"] and log["step"]
    assert all(cast is False for cast, _ in log["backward"]), f"autocast on in the backward pass: {log}"
    assert all(cast is False for cast, _ in log["step"]), f"autocast on in optimizer.step(): {log}"
    assert all(tf32 for _, tf32 in log["backward"] + log["step"]), f"TF32 off in part of the step: {log}"


def test_the_ladder_times_backward_and_step_outside_autocast(monkeypatch):
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from transformers import BertConfig, BertForSequenceClassification

    from helpers.train import ladder

    seen = {"backward": [], "step": []}
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen["step"].append(torch.is_autocast_enabled("cpu")))
    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=2000, attn_implementation="eager", num_labels=5)

    def make_model():
        torch.manual_seed(0)
        m = BertForSequenceClassification(cfg)
        m.classifier.weight.register_hook(lambda g: seen["backward"].append(torch.is_autocast_enabled("cpu")))
        return m

    batches, check = ladder.sample_batches([5, 31, 12, 32, 20, 7], batch_size=2, n_batches=3, seq_len=32,
                                           vocab=2000, n_classes=5)
    try:
        ladder.measure_stack(RunSpec(precision="bf16", attn="eager", padding="fixed"), None,
                             make_model=make_model, batches=batches, check=check,
                             device=torch.device("cpu"), repeats=1)
    finally:
        hook.remove()
    assert seen["backward"] and seen["step"]
    assert not any(seen["backward"]) and not any(seen["step"]), seen


@pytest.mark.parametrize("padding", ["fixed", "dynamic", "bucketed", "packed"])
def test_the_dataloader_batches_every_example_once_with_its_padding(padding):
    loader = RunSpec(padding=padding).dataloader(_dataset(), 2, max_length=16, seed=1, device="cpu")
    batches = list(loader)
    ids = sorted(tuple(row[m.bool()].tolist()) for b in batches for row, m in
                 zip(b["input_ids"], b["attention_mask"]) if padding != "packed")
    if padding == "packed":  # rows hold whole documents: count the real tokens and the documents
        assert sum(int(b["attention_mask"].sum()) for b in batches) == sum(LENGTHS)
        assert sum(len(b["labels"]) for b in batches) == len(LENGTHS)
        assert all(b["input_ids"].shape[1] == 16 for b in batches)
    else:
        assert ids == sorted(tuple(range(1, n + 1)) for n in LENGTHS)
        widths = {b["input_ids"].shape[1] for b in batches}
        assert widths == {16} if padding == "fixed" else max(widths) <= max(LENGTHS)


def test_the_dataloader_pins_for_a_gpu_only():
    # issue 18: the DataLoader pins (pin_memory=True; with num_workers=0 inside next(), on the loop's own
    # thread, with workers in its pin thread), not code of the loop (PyTorch's pin_memory guide)
    assert RunSpec().dataloader(_dataset(), 2, device="cuda").pin_memory
    assert RunSpec(padding="packed").dataloader(_dataset(), 2, device="cuda").pin_memory
    assert not RunSpec().dataloader(_dataset(), 2, device="cpu").pin_memory


def test_apply_sets_the_attention_and_wraps_a_packed_model():
    from transformers import BertConfig, BertForSequenceClassification

    from helpers.model.packed_model import PackedModel

    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    out = RunSpec(attn="sdpa", padding="packed").apply(model)
    assert isinstance(out, PackedModel) and out.model.config._attn_implementation == "sdpa"
    if compat.at_least("transformers", "5.0"):  # transformers 4.x switches by rebuilding (compat)
        assert out.model is model
    assert RunSpec().apply(model) is model  # nothing asked, nothing changed


def test_apply_sets_flex_varlen_and_activation_checkpointing(monkeypatch):
    from transformers import BertConfig, BertForSequenceClassification

    import helpers.train.runspec

    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, attn_implementation="eager")
    model = RunSpec(activation_checkpointing=True).apply(BertForSequenceClassification(cfg))
    assert getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing")
    if "flex_attention" in compat.bert_attn_implementations():
        flex = RunSpec(attn="flex").apply(BertForSequenceClassification(cfg))
        assert flex.config._attn_implementation == "flex_attention"
    varlen = []
    monkeypatch.setattr(helpers.train.runspec, "use_varlen", lambda m: varlen.append(m) or m)
    out = RunSpec(attn="varlen", precision="bf16", padding="packed").apply(BertForSequenceClassification(cfg))
    assert len(varlen) == 1 and out.model is varlen[0]  # varlen attention, then the packed forward


def test_describe_gives_the_code_of_the_changed_switches():
    text = RunSpec(precision="bf16", attn="sdpa", padding="bucketed").describe()
    assert "RunSpec(precision='bf16', attn='sdpa', padding='bucketed')" in text
    assert "spec.apply(model)" in text and "spec.dataloader(" in text and "spec=spec" in text
    assert "RunSpec()" in RunSpec().describe()


# --- one home for each switch: a source test ---------------------------------------------------------

# tf32_matmuls / autocast_context / set_tf32: defined in helpers.core.precision, applied by RunSpec's contexts
# only.
# Exempt, with the reason: helpers/measure/roofline.py measures the TF32 matmul *rate* of the chip (lesson
# 00's
# roofline, a measure-layer module that cannot import RunSpec), and lesson 02 teaches the primitives.
SWITCH_CALL = re.compile(r"\b(tf32_matmuls|autocast_context|set_tf32)\(")
# exempt: the homes of the switches, and the cells that measure the precisions themselves (the roofline,
# lesson 00's TF32 control of its fp32 accuracy check, lesson 02's precision experiments): no training step
# roofline measures each precision's rate, memory's dry run each precision's bytes: neither is a run of a spec
# and so lessons 00 and 02's modules, and the planner's op count (helpers.measure.opcount.count_step: a fake
# step under autocast, as memory's dry run)
SWITCH_EXEMPT = {"helpers/core/precision.py", "helpers/train/runspec.py", "helpers/measure/roofline.py",
                 "helpers/measure/memory.py",
                 "helpers/measure/opcount.py", "notebooks/00_setup.ipynb",
                 "notebooks/02_mixed_precision.ipynb",
                 "course/lessons/lesson00.py", "course/lessons/lesson02.py"}
# MFU: helpers.measure.flops.mfu is the one formula; nothing else divides by a peak or rescales an MFU
MFU_INLINE = re.compile(r"/\s*\(?\s*[\w.\[\]\"']*\bpeak(_flops)?(\.flops)?\b(?![\w(])"
                        r"|\bmfu\b[\"'\]]*\s*\*\s*\w+\s*/\s*\w")


def _code(text: str) -> str:
    """`text` with its comments and docstrings blanked out: what runs (a docstring may state a formula)."""
    lines = text.splitlines(keepends=True)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            doc = tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU")[:3] in ('"""', "'''")
            if tok.type == tokenize.COMMENT or doc:
                (r0, c0), (r1, c1) = tok.start, tok.end
                for r in range(r0, r1 + 1):
                    a, b = (c0 if r == r0 else 0), (c1 if r == r1 else len(lines[r - 1]))
                    lines[r - 1] = lines[r - 1][:a] + " " * (b - a) + lines[r - 1][b:]
    except (tokenize.TokenError, IndentationError):  # a notebook cell with IPython syntax: as it is
        return text
    return "".join(lines)


def _sources():
    for folder in ("helpers", "course", "scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), _code(path.read_text())
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join(_code("".join(c["source"])) for c in cells if c["cell_type"] == "code")
        yield path.relative_to(ROOT).as_posix(), code


def test_each_switch_is_applied_in_one_function_and_mfu_only_in_flops():
    switches = [f"{name}: {m.group(0)}" for name, text in _sources() if name not in SWITCH_EXEMPT
                for m in SWITCH_CALL.finditer(text)]
    assert not switches, f"apply TF32/autocast through RunSpec.step_context / RunSpec.autocast: {switches}"
    # regimes.roof_times divides FLOPs (not FLOP/s) by the peak: the time at the roof, its one home
    inline = [f"{name}: {m.group(0)}" for name, text in _sources()
              if name not in ("helpers/measure/flops.py", "helpers/measure/regimes.py",
                              "course/exercises/lesson04.py",
                              # lesson 02 writes MFU's formula out where it teaches it (the method on the
                              # page), beside the loop's count it checks its FLOPs per token against
                              "notebooks/02_mixed_precision.ipynb")
              and not name.startswith("course/solutions/")  # a learner's answer, and the check of one
              for m in MFU_INLINE.finditer(text)]
    assert not inline, f"compute MFU with helpers.measure.flops.mfu: {inline}"


def test_the_source_test_catches_a_planted_switch_and_an_inline_mfu():
    assert SWITCH_CALL.search("    with tf32_matmuls(True), autocast_context(p, dev):")
    assert MFU_INLINE.search("mfu = useful / timed / peak")
    assert MFU_INLINE.search('"mfu": res.mfu * world / devices')
    assert not MFU_INLINE.search("mfu(tokens / t, flops / tokens, peak)")
    assert not MFU_INLINE.search("r.peak_memory_bytes / base.peak_memory_bytes")
    assert "peak" not in _code('"""MFU = flops / peak"""  # / peak\nx = 1')
