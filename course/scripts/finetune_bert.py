"""Fine-tune a pretrained BERT classifier on a labelled text corpus: lesson 08 as a script.

One process, or several under torchrun (DDP when WORLD_SIZE > 1: NCCL on GPUs, gloo on CPUs). Every
switch of lesson 08's ladder is a flag, named as the notebook's parameters (--max-length is
MAX_LENGTH there); the switches become one `helpers.train.runspec.RunSpec` (`FinetuneConfig.spec`), which
batches the data, prepares the model and runs the steps, as in the notebook. Checkpoints go to
--checkpoint-dir every --checkpoint-every steps, atomically; run
the same command again and it resumes from the last one.

The defaults are the course's recipe (one epoch at 128 tokens): batch 16, AdamW at a peak lr of 1e-4 with
a linear warm-up over 10 % of the steps and a linear decay to 0, weight decay 0.01, fp32, SDPA attention,
the fused AdamW kernel, each batch padded to its longest. They were picked on the validation split, from
candidates that each changed one thing of the former defaults (`benchmarks/capstone_vs_trainer.py --search`,
results in `benchmarks/results/capstone-vs-trainer-cpu-recipes-*.md`), and that benchmark sets them beside
Hugging Face's Trainer with its defaults (`capstone-vs-trainer-cpu.md`).

    python -m course.scripts.finetune_bert --tfidf-baseline     # the full run, the course's recipe torchrun
    --standalone --nproc-per-node 2 -m course.scripts.finetune_bert --max-examples 200 --max-steps 4

Prints one JSON line starting with `RESULT ` (rank 0) and, with --results-json, writes it to a file.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from helpers.core.compat import exit_now
from helpers.data.text import load_text_classification, padding_fraction, tokenize
from helpers.measure.flops import executed_flops, mfu
from helpers.model.models import load_bert
from helpers.train.distributed import setup, teardown
from helpers.train.evaluation import evaluate
from helpers.train.loop import LR_SCHEDULES, TrainConfig, train
from helpers.train.runspec import RunSpec, dataclass_flags, flag_parser, spec_flags, spec_from_arguments

# The run's switches when no flag changes them: fp32, SDPA, fused AdamW, each batch padded to its longest.
RECIPE_SPEC = RunSpec(attn="sdpa")


@dataclass
class FinetuneConfig:
    """The run: what to train on and how long (here), and its switches (`spec`, a RunSpec); the notebook's
    parameters carry the same names in upper case."""

    model_name: str = "bert-base-uncased"  # hub id or local folder; offline: the bundled MiniLM
    max_length: int = 128  # tokens per document (longer ones are truncated)
    batch_size: int = 16  # samples per step on each process
    lr: float = 1e-4  # peak learning rate
    lr_schedule: str = "linear"  # linear warm-up, then linear decay to 0 ("constant": held after warm-up)
    warmup_frac: float = 0.1  # warm-up over this fraction of the steps
    weight_decay: float = 0.01
    epochs: int = 1
    max_steps: int = 0  # > 0: stop after this many steps (per process) whatever the epochs
    max_examples: int = 0  # > 0: a stratified subset of the corpus (smoke runs)
    spec: RunSpec = RECIPE_SPEC  # precision, FP8, attention, compile, fused AdamW, padding
    eval_batch_size: int = 64
    seed: int = 0  # the training's randomness: the new head's weights, the batch order, dropout
    split_seed: int = 0  # the train/val/test split (and the --max-examples subset): the course's split is 0
    checkpoint_dir: str = ""  # "" = no checkpoints; else resume from the newest one there
    checkpoint_every: int = 0  # steps; 0 = never
    save_dir: str = ""  # "" = do not save the fine-tuned model (save_pretrained)
    device: str = "auto"  # auto | cpu | cuda
    tfidf_baseline: bool = False  # also report TF-IDF + logistic regression on the same split
    peak_flops: float = 0.0  # FLOP/s of one device for MFU; 0 = helpers.measure.roofline.peak_flops

    def __post_init__(self) -> None:
        if not isinstance(self.spec, RunSpec):
            raise ValueError(f"spec must be a helpers.train.runspec.RunSpec such as "
                             f"RunSpec(padding='dynamic'), "
                             f"got {type(self.spec).__name__}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if min(self.max_length, self.batch_size, self.epochs, self.eval_batch_size) < 1 or self.lr <= 0:
            raise ValueError("max_length, batch_size, epochs, eval_batch_size and lr must be positive: "
                             f"{self}")
        if self.max_length > 512:
            raise ValueError(f"max_length={self.max_length}: BERT has 512 positions")


def load_splits(cfg: FinetuneConfig, verbose: bool = True):
    """The corpus split train/val/test by `split_seed`: the hub's copy online, the bundled one offline."""
    return load_text_classification("auto", seed=cfg.split_seed, max_examples=cfg.max_examples or None,
                                    verbose=verbose)


def tokenize_splits(splits: Any, tokenizer: Any, cfg: FinetuneConfig) -> dict[str, Any]:
    """{"train", "val", "test"}: each split tokenised (truncated to max_length, not padded)."""
    return {name: tokenize(getattr(splits, name), tokenizer, max_length=cfg.max_length)
            for name in ("train", "val", "test")}


def make_batches(dataset: Any, cfg: FinetuneConfig, *, rank: int = 0, world_size: int = 1,
                 pad_token_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """This process's training batches of every epoch, in order (`RunSpec.dataloader`): full batches only;
    every process draws the same order and keeps every world_size-th batch."""
    out: list[dict[str, torch.Tensor]] = []
    for epoch in range(cfg.epochs):
        loader = cfg.spec.dataloader(dataset, cfg.batch_size, pad_token_id=pad_token_id,
                                     max_length=cfg.max_length, seed=cfg.seed * 1000 + epoch, device="cpu")
        batches = [b for b in loader if len(b["labels"]) == cfg.batch_size]
        batches = batches[: len(batches) - len(batches) % world_size]  # every process takes as many steps
        out += batches[rank::world_size]
    if not out:
        raise ValueError(f"no full batch of {cfg.batch_size} x {world_size} processes in {len(dataset)} "
                         "training examples: lower batch_size or raise max_examples")
    return out


def build_model(cfg: FinetuneConfig, num_labels: int, verbose: bool = True):
    """(model, tokenizer): the pretrained classifier, loaded with the spec's attention (None: load_bert's)."""
    torch.manual_seed(cfg.seed)  # the new classifier head starts the same in every run of this seed
    attn = {} if cfg.spec.attn is None else {"attn_implementation": cfg.spec.attn}
    return load_bert(cfg.model_name, num_labels=num_labels, verbose=verbose, **attn)


def tfidf_baseline(splits: Any) -> float:
    """Test accuracy of TF-IDF features + logistic regression trained on the same train split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vec = TfidfVectorizer(sublinear_tf=True, min_df=2, ngram_range=(1, 2))
    x_train = vec.fit_transform(splits.train.texts)
    clf = LogisticRegression(max_iter=2000, C=10.0).fit(x_train, splits.train.labels)
    return float(clf.score(vec.transform(splits.test.texts), splits.test.labels))


def executed_flops_per_s(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]],
                         step_times_s: list[float]) -> float:
    """FLOP/s the hardware executed in steps 1.. (step 0 is warm-up), padding included
    (`helpers.measure.flops.executed_flops`); MFU counts real tokens only
    (`helpers.train.meter.TrainResult`)."""
    if len(step_times_s) < 2:
        return 0.0
    return executed_flops(model, batches[1:len(step_times_s)]) / sum(step_times_s[1:])


def finetune(cfg: FinetuneConfig, *, log=print) -> dict[str, Any]:
    """Fine-tune as `cfg` says, in this process (and its torchrun peers); returns the measurements."""
    env = setup(cfg.device, timeout_s=1800.0)  # rank 0 evaluates while the others wait at the barrier
    main_rank = env.rank == 0
    say = log if main_rank else (lambda *a, **k: None)
    try:
        cfg.spec.check(env.device)  # before minutes of loading: can this device run the spec?
        t_start = time.perf_counter()
        splits = load_splits(cfg, verbose=main_rank)
        model, tokenizer = build_model(cfg, num_labels=splits.num_labels, verbose=main_rank)
        data = tokenize_splits(splits, tokenizer, cfg)
        pad = tokenizer.pad_token_id or 0
        t_batch = time.perf_counter()
        batches = make_batches(data["train"], cfg, rank=env.rank, world_size=env.world_size, pad_token_id=pad)
        batching_s = time.perf_counter() - t_batch  # collating every batch up front (the loop's part of it)
        steps = min(len(batches), cfg.max_steps) if cfg.max_steps else len(batches)
        raw = model.to(env.device)
        spec = cfg.spec
        run: torch.nn.Module = spec.apply(raw)  # attention, compiled layers, packed forward
        if env.distributed:  # DDP wraps the prepared model: its hooks all-reduce while backward runs
            from torch.nn.parallel import DistributedDataParallel as DDP
            run = DDP(run, device_ids=[env.device.index] if env.device.type == "cuda" else None)
        tcfg = TrainConfig(steps=steps, lr=cfg.lr, lr_schedule=cfg.lr_schedule, warmup_frac=cfg.warmup_frac,
                           weight_decay=cfg.weight_decay, max_grad_norm=1.0, seed=cfg.seed,
                           checkpoint_dir=cfg.checkpoint_dir or None,
                           checkpoint_every=cfg.checkpoint_every if cfg.checkpoint_dir else 0,
                           progress=main_rank, track_memory=True, peak_flops=cfg.peak_flops or None)
        say(f"finetune: {steps} steps of {cfg.batch_size} x {env.world_size} process(es) on {env.device}, "
            f"{spec}, lr {cfg.lr} {cfg.lr_schedule} (warm-up {tcfg.warmup} steps)")
        t_train = time.perf_counter()
        res = train(run, batches, tcfg, env.device, spec=spec)
        train_s = time.perf_counter() - t_train
        done = batches[(res.resumed_from or 0):(res.resumed_from or 0) + len(res.step_times_s)]
        world = env.world_size
        # one device per process on GPUs; CPU processes share one CPU, whose peak covers them all
        devices = world if env.device.type == "cuda" else 1
        result: dict[str, Any] = {
            "config": asdict(cfg), "world_size": world, "device": str(env.device),
            "threads": torch.get_num_threads(),  # CPU threads per process (OMP_NUM_THREADS, else all)
            "model_source": getattr(raw, "course_source", "?"),
            "pretrained": getattr(raw, "course_pretrained", None), "steps": res.steps_done,
            "resumed_from": res.resumed_from, "final_loss": res.final_loss, "losses": res.losses,
            "lrs": res.lrs, "train_s": train_s, "batching_s": batching_s,
            # every process handled as many samples: the job's throughput is world_size x one process's
            "samples_per_s": res.samples_per_s * world if res.samples_per_s is not None else None,
            "tokens_per_s": res.tokens_per_s * world if res.tokens_per_s is not None else None,
            # the job's MFU: all processes' useful FLOP/s over the peak of the devices they share
            "mfu": (mfu(res.tokens_per_s * world, res.flops_per_token, res.peak_flops * devices)
                    if res.mfu is not None else None),
            "peak_flops": res.peak_flops, "peak_source": res.peak_source,
            "executed_flops_per_s": executed_flops_per_s(raw, done, res.step_times_s) * world or None,
            "first_step_s": res.step_times_s[0] if res.step_times_s else None,
            "padding": padding_fraction(done) if done else None,
            "peak_memory_bytes": res.peak_memory_bytes}
        if result["mfu"] is None and main_rank:
            say(f"finetune: no MFU: {res.peak_source or 'nothing timed'} (measure its roofline in lesson 00, "
                "or pass --peak-flops)")
        if main_rank:
            acc_val = evaluate(raw, data["val"], batch_size=cfg.eval_batch_size, spec=spec,
                               device=env.device, pad_token_id=pad)[0] if len(data["val"]) else None
            acc_test = evaluate(raw, data["test"], batch_size=cfg.eval_batch_size, spec=spec,
                                device=env.device, pad_token_id=pad)[0]
            result.update(val_accuracy=acc_val, test_accuracy=acc_test, total_s=time.perf_counter() - t_start,
                          train_examples=len(data["train"]), test_examples=len(data["test"]),
                          label_names=splits.label_names)
            if cfg.tfidf_baseline:
                t0 = time.perf_counter()
                result["tfidf_test_accuracy"] = tfidf_baseline(splits)
                result["tfidf_s"] = time.perf_counter() - t0
            if cfg.save_dir:
                raw.save_pretrained(cfg.save_dir)
                tokenizer.save_pretrained(cfg.save_dir)
            rate = f"{result['samples_per_s']:.2f} samples/s" if result["samples_per_s"] else "no timed steps"
            say(f"finetune: test accuracy {acc_test:.4f}, {train_s:.1f} s training, {rate}")
        return result
    finally:
        teardown()


def _parser() -> Any:
    """The command line (transformers.HfArgumentParser, helpers.train.runspec.flag_parser): one flag per
    FinetuneConfig field, and one per field of its RunSpec, with the script's defaults."""
    defaults = FinetuneConfig()
    clash = {f.name for f in fields(RunSpec)} & {f.name for f in fields(FinetuneConfig)}
    assert not clash, f"FinetuneConfig repeats RunSpec's fields {clash}: they belong in cfg.spec"
    own = dataclass_flags(defaults, [f.name for f in fields(FinetuneConfig) if f.name != "spec"])
    switches = spec_flags(defaults=defaults.spec)  # the run's switches, nested into FinetuneConfig.spec
    p = flag_parser(own, switches, description=__doc__.split("\n\n")[0])
    p.add_argument("--results-json", default="", help="write the result here (rank 0)")
    return p


def config_from_args(argv: list[str] | None = None) -> tuple[FinetuneConfig, str]:
    """(FinetuneConfig, --results-json) from command-line arguments; the RunSpec flags fill cfg.spec."""
    parser = _parser()
    try:
        own, switches, rest = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        return FinetuneConfig(spec=spec_from_arguments(switches), **asdict(own)), rest.results_json
    except ValueError as err:  # a switch RunSpec or FinetuneConfig refuses, an unknown flag: usage and why
        parser.error(str(err))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry point (also under torchrun)."""
    cfg, out = config_from_args(argv)
    result = finetune(cfg)
    if "test_accuracy" in result:  # rank 0
        print("RESULT " + json.dumps(result), flush=True)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
    exit_now()  # its results are written: skip the interpreter's teardown (1-2 s per process here)
