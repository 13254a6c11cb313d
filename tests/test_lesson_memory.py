"""Every lesson's GPU steps on a faked T4 and a faked 24 GB L4, with the memory the lesson keeps alive counted
(issue 39): each step fits with at least 5 % of the card to spare.

A step's memory is three things here:

- the step itself, at the sizes the lesson's setup picks on that card (tests/lesson_sizes.py): the setup's own
  estimate where it counts only the step, otherwise the same estimator (`estimate_training_memory`, checked
  against a FakeTensorMode + MemTracker trace in test_gpu_matrix.py) on the step alone;
- what earlier cells keep alive on the device: the notebook's names still bound when the step's cell starts
  (read from the notebook's code: assigned by an earlier cell and not `del`eted since), each counted by a
  formula of the sizes (`KEPT_BYTES`). Which names hold device memory was read from the notebooks; a name that
  holds none (a table, a Timing, a float) is not listed;
- the notebook's CUDA context (outside PyTorch's allocator; lesson 08's NOTEBOOK_CONTEXT_BYTES).

Lesson 08's steps are traced with fake tensors in tests/test_lesson08.py, the models it keeps included; that
test checks the same 5 %. Its ladder is counted here as a whole climb (issue 49): `helpers.train.ladder.climb`
on the faked card, each candidate's traced step beside every arm the climb still holds, with a planted leak.
Lesson 07's steps run in torchrun's processes: the notebook keeps no tensor there, only its CUDA context on
GPU 0. Nothing is allocated: the whole file takes a few seconds.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from fakegpu import GPU_CLASSES
from lesson_sizes import NOTEBOOKS, decisions, setup_arguments

from course.lessons import lesson04, lesson08
from course.profile import small_config
from helpers.core.units import GiB
from helpers.measure.memory import estimate_training_memory
from helpers.model.models import SmallTransformer

SPARE = 0.05  # issue 39: every step fits with at least 5 % of the card to spare
CARDS = ("T4", "L4")  # a free Colab/Kaggle GPU, and a 24 GB card
CONTEXT = lesson08.NOTEBOOK_CONTEXT_BYTES  # the notebook process's CUDA context on its GPU

Sizes = dict[str, Any]  # the lesson's decisions (decide's answer)
Bytes = Callable[[Sizes], int]


# --- the names a notebook keeps bound when a cell starts ---------------------------------------------------

def _code(cell: dict[str, Any]) -> ast.Module:
    """A code cell's source as Python, IPython's %magic and !shell lines made no-ops."""
    lines = []
    for line in "".join(cell["source"]).splitlines():
        stripped = line.lstrip()
        lines.append(line[: len(line) - len(stripped)] + "pass" if stripped.startswith(("%", "!")) else line)
    return ast.parse("\n".join(lines))


def _events(node: ast.AST) -> list[tuple[str, str]]:
    """("bind" | "del", name) of the top-level names `node` binds or deletes, in order; functions', classes'
    and comprehensions' own names are local to them and left out."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [("bind", node.name)]
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return []
    if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Store):
            return [("bind", node.id)]
        return [("del", node.id)] if isinstance(node.ctx, ast.Del) else []
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [("bind", (a.asname or a.name).split(".")[0]) for a in node.names]
    if isinstance(node, ast.Assign):  # the value is computed before the names are bound
        return _events(node.value) + [e for t in node.targets for e in _events(t)]
    out = []
    for child in ast.iter_child_nodes(node):
        out += _events(child)
    return out


def cells_of(lesson: str) -> list[dict[str, Any]]:
    """The notebook's code cells, in order."""
    nb = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def alive_at(cells: list[dict[str, Any]], cell_id: str) -> set[str]:
    """The names earlier cells bound and did not delete when the cell `cell_id` starts (Run All, in order)."""
    ids = [c.get("id") for c in cells]
    assert cell_id in ids, f"no code cell {cell_id!r}: the step moved"
    alive: set[str] = set()
    for cell in cells[: ids.index(cell_id)]:
        for kind, name in _events(_code(cell)):
            (alive.add if kind == "bind" else alive.discard)(name)
    return alive


# --- what each lesson keeps, and its steps ------------------------------------------------------------------

@functools.cache
def _small(profile: str, vocab: int, seq: int | None = None, n_layers: int | None = None) -> SmallTransformer:
    """The course's small Transformer of these shapes on the meta device."""
    extra = {k: v for k, v in (("max_len", seq), ("n_layers", n_layers)) if v is not None}
    with torch.device("meta"):
        return SmallTransformer(small_config(profile, vocab_size=vocab, **extra))


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _p02(s: Sizes) -> int:  # lesson 02's small model
    return _params(_small(s["PROFILE"], s["VOCAB"], s["SEQ"]))


def _attn01(s: Sizes, dtype_bytes: int | None = None) -> int:  # one (B, N, H * d) tensor of lesson 01
    return s["BATCH"] * s["SEQ"] * s["HEADS"] * s["HEAD_DIM"] * (dtype_bytes or s["DTYPE"].itemsize)


@functools.cache
def _gpt2_params(profile: str, vocab: int, seq: int) -> int:  # lesson 03's GPT-2 of the small model's shape
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = _small(profile, vocab, seq).cfg
    with torch.device("meta"):
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layers, n_embd=cfg.d_model, n_head=cfg.n_heads,
                                          n_inner=cfg.d_ff, vocab_size=vocab, n_positions=seq, bos_token_id=0,
                                          eos_token_id=0))
    return _params(gpt2)


def _p03(s: Sizes) -> int:
    return _params(_small(s["PROFILE"], s["VOCAB"], s["SEQ"]))


def _shapes04(s: Sizes) -> tuple[SmallTransformer, SmallTransformer]:
    return lesson04._shapes(s["PROFILE"], s["VOCAB"], s["BERT_SIZE"], s["DROPOUT"])


def _d04(s: Sizes) -> int:
    return _shapes04(s)[0].cfg.d_model


def _p05(s: Sizes) -> int:
    return _params(_small(s["PROFILE"], s["VOCAB"], None, s["N_LAYERS"]))


@functools.cache
def _small06_of(profile: str, max_len: int) -> SmallTransformer:  # lesson 06's: BBC News has 5 classes
    with torch.device("meta"):
        return SmallTransformer(small_config(profile, n_classes=5, max_len=max_len))


def _max_len06() -> int:  # the notebook's MAX_LEN, as its set-up cell passes it
    return setup_arguments("06_input_pipeline")["max_len"]


def _small06(s: Sizes) -> SmallTransformer:
    return _small06_of(s["PROFILE"], _max_len06())


# notebook name -> the device bytes it holds while bound, per lesson (read from the notebooks: their shapes,
# dtypes, and what each object keeps: a model after a step keeps its gradients, an optimizer AdamW's moments)
KEPT_BYTES: dict[str, dict[str, Bytes]] = {
    "00_setup": {  # section 4's fp32 a and b, and their float64 product
        "a": lambda s: 4 * s["MATMUL_SIZE"] ** 2, "b": lambda s: 4 * s["MATMUL_SIZE"] ** 2,
        "reference": lambda s: 8 * s["MATMUL_SIZE"] ** 2},
    "01_attention": {
        "x": _attn01, "q": _attn01, "k": _attn01, "v": _attn01, "out": _attn01,
        "qkv": lambda s: (3 * (s["HEADS"] * s["HEAD_DIM"]) ** 2 + 3 * s["HEADS"] * s["HEAD_DIM"])
        * s["DTYPE"].itemsize,
        "reference": lambda s: _attn01(s, 4),  # the fp32 math kernel's output
        "outputs": lambda s: 3 * _attn01(s)},  # by hand, SDPA, naive
    "02_mixed_precision": {
        "x": lambda s: 16 * 64 * 4, "w": lambda s: 64 * 64 * 4, "y": lambda s: 16 * 64 * 2,
        "z": lambda s: 16 * 64 * 4,
        # section 4's GradScaler demo: its model (weights, the last step's gradients), AdamW's two moments,
        # the clones of the weights, the checkpoint loaded back onto the device (weights and AdamW's moments)
        "model": lambda s: 8 * _p02(s), "optimizer": lambda s: 8 * _p02(s), "before": lambda s: 4 * _p02(s),
        "state": lambda s: 12 * _p02(s), "batch": lambda s: 2 * 8 * s["BATCH"] * s["SEQ"],
        # section 5's fp32 a, b and their product; a_ and b_ in the loop's last dtype, float16
        "a": lambda s: 4 * s["MATMUL_N"] ** 2, "b": lambda s: 4 * s["MATMUL_N"] ** 2,
        "ref": lambda s: 4 * s["MATMUL_N"] ** 2, "a_": lambda s: 2 * s["MATMUL_N"] ** 2,
        "b_": lambda s: 2 * s["MATMUL_N"] ** 2},
    "03_memory": {
        # section 1's model after its steps (weights, gradients), its fused AdamW, the batch on the device
        "model": lambda s: 8 * _p03(s), "optimizer": lambda s: 8 * _p03(s),
        "batch": lambda s: 2 * 8 * s["BATCH"] * s["SEQ"],
        # compare_estimators moves GPT-2 to the device to measure its step: weights and gradients stay
        "gpt2": lambda s: 8 * _gpt2_params(s["PROFILE"], s["VOCAB"], s["SEQ"])},
    "04_where_time_goes": {
        "x": lambda s: 4 * s["BATCH"] * s["SEQ"] * _d04(s), "w": lambda s: 4 * 4 * _d04(s) ** 2,
        "h": lambda s: 4 * 4 * s["BATCH"] * s["SEQ"] * _d04(s),
        # a step closure keeps its model (weights, gradients), AdamW's moments and its batch
        "small_step": lambda s: 16 * _params(_shapes04(s)[0]) + 16 * s["BATCH"] * s["SEQ"],
        "bert_step": lambda s: 16 * _params(_shapes04(s)[1]) + 24 * s["BERT_BATCH"] * s["BERT_SEQ"],
        "tiny_step": lambda s: 16 * _params(_shapes04(s)[0]) + 16 * s["BATCHES"][0] * s["SEQ"],
        "sweep": lambda s: sum(16 * _params(_shapes04(s)[0]) + 16 * b * s["SEQ"] for b in s["BATCHES"])},
    "05_compile": {  # copies of `base`: weights, and gradients where a step or a forward-backward left them
        "base": lambda s: 4 * _p05(s), "eager": lambda s: 4 * _p05(s), "ref_grads": lambda s: 4 * _p05(s),
        "compiled": lambda s: 8 * _p05(s), "twin": lambda s: 8 * _p05(s), "again": lambda s: 8 * _p05(s),
        "m": lambda s: 4 * _p05(s), "regional": lambda s: 4 * _p05(s),
        "batch": lambda s: 2 * 8 * s["BATCH"] * s["SEQ"]},
    "06_input_pipeline": {"model0": lambda s: 4 * _params(_small06(s))},  # every experiment copies it
    "07_distributed": {},
    "09_plan_your_run": {},
    "10_make_it_fit": {},  # the planner allocates nothing; the levers run on the CPU
}


def _step05(s: Sizes) -> int:
    """Lesson 05's side-by-side timing: a fourth copy (`whole`), the three arms' AdamW moments, one arm's step
    (its gradients, activations, temporaries), and the CUDA graphs reduce-overhead and max-autotune keep."""
    e = estimate_training_memory(_small(s["PROFILE"], s["VOCAB"], None, s["N_LAYERS"]), s["BATCH"], s["SEQ"])
    return 4 * _p05(s) + 3 * 8 * _p05(s) + 4 * _p05(s) + e.activations + e.temporary \
        + 2 * (e.activations + e.temporary)


def _step04(batch_key: str, bert: bool = False) -> Bytes:
    def peak(s: Sizes) -> int:
        small, big = _shapes04(s)
        if bert:
            return estimate_training_memory(big, s["BERT_BATCH"], s["BERT_SEQ"]).peak
        return estimate_training_memory(small, s[batch_key], s["SEQ"]).peak
    return peak


@dataclass(frozen=True)
class Step:
    """One GPU step of a lesson: the cell that runs it, the setup's name for it, and its own peak bytes (by
    default the setup's estimate of it)."""

    lesson: str
    cell: str  # the id of the code cell that runs it
    name: str  # its name among the setup's estimates (Fit.steps)
    own: Bytes | None = None  # its peak without what earlier cells keep, where the estimate counts those
    # device holders the step's own peak already counts (its own model)
    also: tuple[str, ...] = field(default=())

    def peak(self, s: Sizes) -> int:
        return int(self.own(s) if self.own is not None else s["FIT"].steps[self.name](s["FIT"].sizes))


def _step03(s: Sizes) -> int:  # a trade-off variant: the baseline's step, the largest of the four
    return estimate_training_memory(_small(s["PROFILE"], s["VOCAB"], s["SEQ"]), s["BATCH"], s["SEQ"]).peak


def _sweep04(s: Sizes) -> int:  # the largest batch's step, every batch size's model and AdamW kept alive
    return _step04("BATCHES_MAX")(s) + KEPT_BYTES["04_where_time_goes"]["sweep"](s)


def _step06(s: Sizes) -> int:  # the copy of model0 that trains; model0 is counted as kept
    return estimate_training_memory(_small06(s), s["BATCH"], _max_len06()).peak


def _step07(s: Sizes) -> int:  # rank 0's step on GPU 0, and its own CUDA context beside the notebook's
    return int(s["FIT"].steps["DDP, one rank"](s["FIT"].sizes)) + CONTEXT


STEPS = [
    Step("00_setup", "934746b3", "the matmul, checked against float64"),
    Step("00_setup", "eb385e16", "the copy: a source and a destination"),  # in measure_roofline
    Step("00_setup", "f5087b48", "the copy: a source and a destination"),  # section 5's add, x and y
    Step("01_attention", "l01-07", "attention by hand (scores, fp32 softmax)"),
    Step("01_attention", "l01-07", "the fp32 math reference"),
    Step("01_attention", "l01-09", "naive attention at the longest N"),
    Step("01_attention", "l01-18", "one batch element at the longest N"),
    Step("01_attention", "l01-31", "fp32 SDPA with a dense mask"),
    Step("02_mixed_precision", "b403bb6a", "the small model's step"),
    Step("02_mixed_precision", "f457c143", "the matmuls"),
    Step("02_mixed_precision", "1648fe08", "the wide model's step"),
    Step("03_memory", "b23a6496", "one training step, measured and recorded", also=("model",)),
    Step("03_memory", "2bfca4cd", "a trade-off variant, beside the first model", _step03),
    Step("04_where_time_goes", "3911d152", "profiling the small Transformer", _step04("BATCH")),
    Step("04_where_time_goes", "d1e16d58", "profiling BERT, beside the small model", _step04("BATCH", True)),
    Step("04_where_time_goes", "fe67820e", "the batch sweep: a model per batch size", _sweep04),
    Step("05_compile", "6b46c559", "a step beside the copies and CUDA graphs", _step05),
    Step("06_input_pipeline", "56163627", "a training step on a copy of model0", _step06),
    Step("07_distributed", "11a7fde5", "DDP, one rank", _step07),
    Step("09_plan_your_run", "l09-here", "the small Transformer's step, measured here"),
    Step("10_make_it_fit", "l10-09", "the small Llama's step, measured on the CPU"),  # nothing on the GPU
]


def kept_bytes(lesson: str, step: Step, s: Sizes,
               cells: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """name -> device bytes, for every device holder bound when the step's cell starts."""
    alive = alive_at(cells if cells is not None else cells_of(lesson), step.cell)
    return {n: f(s) for n, f in KEPT_BYTES[lesson].items() if n in alive and n not in step.also}


def check_fits(gpu: str, step: Step, s: Sizes, kept: dict[str, int]) -> float:
    """The step, what is kept and the CUDA context within the card less SPARE -> the share left free."""
    total = GPU_CLASSES[gpu].total_memory
    peak = step.peak(s)
    used = peak + sum(kept.values()) + CONTEXT
    big = {k: f"{v / GiB:.2f}" for k, v in sorted(kept.items(), key=lambda kv: -kv[1]) if v >= 2**26}
    assert used <= (1 - SPARE) * total, (
        f"{step.lesson} on {gpu} ({total / GiB:.2f} GiB): {step.name} {peak / GiB:.2f} GiB + kept "
        f"{sum(kept.values()) / GiB:.2f} GiB {big} + context {CONTEXT / GiB:.2f} GiB = {used / GiB:.2f} GiB: "
        f"less than {SPARE:.0%} to spare")
    return 1 - used / total


@pytest.mark.parametrize("gpu", CARDS)
def test_every_step_fits_with_what_earlier_cells_keep(gpu):
    for step in STEPS:
        s = decisions(step.lesson, gpu)  # made once per process, shared with test_gpu_matrix
        check_fits(gpu, step, s, kept_bytes(step.lesson, step, s))


def test_the_table_names_what_the_notebooks_bind():
    """A holder renamed or removed in a notebook must not leave a stale entry that counts nothing."""
    for lesson, holders in KEPT_BYTES.items():
        bound = {name for cell in cells_of(lesson) for kind, name in _events(_code(cell)) if kind == "bind"}
        assert set(holders) <= bound, f"{lesson}: {sorted(set(holders) - bound)} are no longer bound"
    lessons = {s.lesson for s in STEPS} | {"08_bert_finetuning"}  # 08: tests/test_lesson08.py
    assert lessons == {p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    for lesson in lessons - {"08_bert_finetuning"}:  # every step a setup estimates has its place here
        estimated = set(decisions(lesson, "T4")["FIT"].steps)
        assert estimated == {s.name for s in STEPS if s.lesson == lesson}, (lesson, sorted(estimated))


def test_alive_at_follows_binds_and_dels():
    cells = [{"id": "1", "source": ["a = b = 1\n", "for i in range(2):\n", "    c = i\n", "def f(d):\n",
                                    "    e = d\n", "%time g = 1\n"]},
             {"id": "2", "source": ["del a, c\n", "a = [h for h in range(3)]\n"]}, {"id": "3", "source": []}]
    assert alive_at(cells, "2") == {"a", "b", "i", "c", "f"}
    assert alive_at(cells, "3") == {"a", "b", "i", "f"}


def test_lesson_02_as_it_was_fails_on_a_t4():
    # planted: the lesson as it was, the GradScaler demo's and section 5's tensors never freed
    cells = cells_of("02_mixed_precision")
    for cell in cells:
        cell["source"] = [line for line in cell["source"] if not line.startswith("del ")]
    step = next(s for s in STEPS if s.name == "the wide model's step")
    s = decisions("02_mixed_precision", "T4")
    kept = kept_bytes("02_mixed_precision", step, s, cells)
    assert {"model", "optimizer", "state", "a", "b", "ref"} <= set(kept)
    with pytest.raises(AssertionError, match="less than 5% to spare"):
        check_fits("T4", step, s, kept)
    check_fits("T4", step, s, kept_bytes("02_mixed_precision", step, s))  # as it is now


def _tensor_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the tensors `obj` holds (a module's parameters and gradients, an optimizer's state, nested
    containers), each storage once."""
    if isinstance(obj, torch.Tensor):
        out = 0
        for t in (obj, obj.grad if obj.is_leaf and obj.grad is not None else None):
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                out += t.untyped_storage().nbytes()
        return out
    if isinstance(obj, torch.nn.Module):
        return sum(_tensor_bytes(t, seen) for t in [*obj.parameters(), *obj.buffers()])
    if isinstance(obj, torch.optim.Optimizer):
        return _tensor_bytes(list(obj.state.values()), seen)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def test_lesson_02s_formulas_match_what_its_cells_keep(monkeypatch, tmp_path):
    """Section 4's GradScaler demo and checkpoint, the cells as the notebook has them, run on this CPU at tiny
    sizes (~2 s): each name's bytes are what its formula says; the checkpoint cell's `del` frees them all."""
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    cells = {c.get("id"): "".join(c["source"]) for c in cells_of("02_mixed_precision")}
    ns: dict[str, Any] = {}
    params = next(c for c in cells_of("02_mixed_precision") if "parameters" in c["metadata"].get("tags", []))
    exec("".join(params["source"]), ns)  # noqa: S102 (the notebook's own cells)
    exec(cells["l02-sizes"], ns)  # noqa: S102
    ns.update(BATCH=2, SEQ=16)  # below smoke, for speed: the formulas hold at any sizes
    exec("from helpers.train.loop import make_optimizer\nfrom helpers.data.synthetic import "
         "synthetic_batch_fn\n"
         "batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=0)", ns)  # noqa: S102 (section 3's)
    exec(cells["c49c994e"], ns)  # noqa: S102 (the hand-written fp16 loop)
    lines = cells["l02-ckpt-code"].splitlines(keepends=True)
    keep = "".join(line for line in lines if not line.startswith("del "))
    exec(keep, ns)  # noqa: S102 (the checkpoint, without its del)
    s = dict(vars(ns["S"]), BATCH=2, SEQ=16)
    for name in ("model", "optimizer", "before", "state", "batch"):
        real, formula = _tensor_bytes(ns[name], set()), KEPT_BYTES["02_mixed_precision"][name](s)
        assert abs(real / formula - 1) < 0.01, (name, real, formula)
    exec(cells["l02-ckpt-code"].splitlines()[-1], ns)  # noqa: S102 (the del)
    assert not {"model", "optimizer", "before", "state", "batch"} & set(ns)


# --- lesson 08's ladder: the whole climb on the card (issue 49) ---------------------------------------------

LADDER = "08_bert_finetuning"


def _bert_base_params() -> int:
    from transformers import BertConfig, BertForSequenceClassification

    from helpers.model.models import MODEL_SIZES

    with torch.device("meta"):
        model = BertForSequenceClassification(BertConfig(**MODEL_SIZES["base"], num_labels=5))
    return _params(model)


def climb_on_the_card(gpu: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], int]:
    """Lesson 08's greedy climb (helpers.train.ladder.climb, the rungs `ladder.plan_rungs` runs on the faked
    card) at the sizes its setup picks there. Each arm holds a model as measure_stack's timed pass does:
    BERT-base's fp32 weights, gradients and AdamW's two moments, 16 bytes a parameter, until the climb lets it
    go. Each candidate's step is traced with fake tensors (tests/test_lesson08.py's `traced`: BERT-base, fp32
    eager, the worst stack; FakeTensorMode + MemTracker) and counted with every arm still held and the
    notebook's CUDA context; beyond the card it raises CUDA's out-of-memory error, as the GPU would. The timed
    passes run on a virtual clock on which every rung is faster (so every rung is kept). -> (rung -> why it
    was not timed, "" when it was; the most bytes a step needed)."""
    import gc
    import weakref

    from fakegpu import fake_gpu
    from test_lesson08 import traced

    from helpers.core import compat
    from helpers.core.timing import Timing
    from helpers.train import ladder

    s = decisions(LADDER, gpu)
    step = traced(s["LADDER_BATCH"], s["MAX_LENGTH"], False)  # the candidate's own step, its state included
    states = 16 * _bert_base_params()
    total = GPU_CLASSES[gpu].total_memory
    fake_gpu(monkeypatch, gpu)
    monkeypatch.setattr(compat, "scaled_mm_supports", lambda device, rowwise: (True, "faked: runs"))
    planned = {p["name"]: p["skipped"] for p in ladder.plan_rungs(torch.device("cuda"))}
    held: weakref.WeakSet = weakref.WeakSet()  # a stand-in per arm for its model, gradients and state
    most = [0]

    class Model:  # what an arm's timed pass holds
        pass

    def measure(stack, ref):
        gc.collect()  # an arm let go of is gone (the real climb holds no reference cycles either)
        need = step + len(held) * states + CONTEXT
        if need > total:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {need - total} bytes. GPU 0 has a total capacity of "
                f"{total / GiB:.2f} GiB of which 0 bytes is free.")
        most[0] = max(most[0], need)
        model = Model()
        held.add(model)
        t = 0.01 * 0.5 ** sum(getattr(stack, f) != getattr(ladder.BASELINE, f) for f in
                              ("precision", "attn", "compile", "fused_adamw", "padding", "fp8"))
        row = {"documents_per_pass": 4, "real_tokens_per_pass": 100, "useful_flops_per_pass": 1e6,
               "padded_fraction": 0.0, "samples_per_s": 4 / t, "pass_median_s": t}
        return ladder.Arm(stack, Timing("t", t, 0.0, 3, 1), None, row, run=lambda: (clock.tick(t), model))

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

        def tick(self, t: float) -> None:
            self.now += t

    clock = Clock()
    monkeypatch.setattr("helpers.core.timing.time", clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # nothing runs on the fake card
    _, steps, _ = ladder.climb(ladder.RUNGS, measure, greedy=True,
                               skip=lambda stack, rung: planned[rung.name], log=lambda line: None)
    return {st.rung.name: st.note for st in steps}, most[0]


@pytest.mark.parametrize("gpu", CARDS)
def test_lesson_08s_whole_climb_fits_the_card_and_times_every_rung_it_runs(gpu, monkeypatch):
    notes, most = climb_on_the_card(gpu, monkeypatch)
    lost = {name: why for name, why in notes.items() if why and not why.startswith("skipped")}
    assert not lost, f"{gpu}: rungs not timed: {lost}"
    total = GPU_CLASSES[gpu].total_memory
    assert most <= (1 - SPARE) * total, (
        f"{gpu}: the climb needed {most / GiB:.2f} GiB of {total / GiB:.2f} GiB: less than {SPARE:.0%} to "
        "spare")
    print(f"{gpu}: every rung it runs timed; the climb's largest step needs {most / GiB:.2f} GiB of "
          f"{total / GiB:.2f} GiB")


@pytest.mark.parametrize("gpu", CARDS)
def test_a_climb_that_keeps_every_arm_loses_rungs_on_the_card(gpu, monkeypatch):
    # planted: the climb as it was (issue 49), every arm's model, gradients and AdamW state kept to the end
    from helpers.train import ladder

    monkeypatch.setattr(ladder, "let_go", lambda arms, keep: None)
    notes, _ = climb_on_the_card(gpu, monkeypatch)
    assert any("did not fit" in why for why in notes.values()), notes
