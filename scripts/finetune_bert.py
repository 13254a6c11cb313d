"""Fine-tune a pretrained BERT classifier on a labelled text corpus: lesson 07 as a script.

One process, or several under torchrun (DDP when WORLD_SIZE > 1: NCCL on GPUs, gloo on CPUs). Every
switch of lesson 07's ladder is a flag, named as the notebook's parameters (--max-length is
MAX_LENGTH there). Checkpoints go to --checkpoint-dir every --checkpoint-every steps, atomically; run
the same command again and it resumes from the last one.

    python scripts/finetune_bert.py --max-length 128 --batch-size 16 --lr 5e-5 --epochs 1   # the full run
    torchrun --standalone --nproc-per-node 2 scripts/finetune_bert.py --max-examples 200 --max-steps 4

Prints one JSON line starting with `RESULT ` (rank 0) and, with --results-json, writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file (torchrun, the command line): make `helpers` importable
    sys.path.insert(0, str(ROOT))

__all__ = ["FinetuneConfig", "load_splits", "tokenize_splits", "make_batches", "build_model", "evaluate",
           "tfidf_baseline", "executed_flops_per_s", "finetune", "main"]

ATTNS = ("eager", "sdpa")
PADDINGS = ("fixed", "bucketed")


@dataclass
class FinetuneConfig:
    """The run's switches; the notebook's parameters carry the same names in upper case."""

    model_name: str = "bert-base-uncased"  # hub id or local folder; offline: the bundled MiniLM
    max_length: int = 128  # tokens per document (longer ones are truncated)
    batch_size: int = 16  # samples per step on each process
    lr: float = 5e-5
    weight_decay: float = 0.01
    epochs: int = 1
    max_steps: int = 0  # > 0: stop after this many steps (per process) whatever the epochs
    max_examples: int = 0  # > 0: a stratified subset of the corpus (smoke runs)
    precision: str = "fp32"  # fp32 | tf32 | bf16 (autocast)
    attn: str = "sdpa"  # eager | sdpa
    compile: bool = False  # torch.compile the model
    fused_adamw: bool = False  # fused AdamW kernel instead of the foreach one
    padding: str = "fixed"  # fixed (every batch max_length wide) | bucketed (dynamic, length buckets)
    eval_batch_size: int = 64
    seed: int = 0
    checkpoint_dir: str = ""  # "" = no checkpoints
    checkpoint_every: int = 0  # steps; 0 = only at the end (when checkpoint_dir is set)
    save_dir: str = ""  # "" = do not save the fine-tuned model (save_pretrained)
    device: str = "auto"  # auto | cpu | cuda
    tfidf_baseline: bool = False  # also report TF-IDF + logistic regression on the same split
    peak_flops: float = 0.0  # FLOP/s of one device for MFU; 0 = a GPU's datasheet bf16 peak, else measured

    def __post_init__(self) -> None:
        if self.attn not in ATTNS:
            raise ValueError(f"attn must be one of {ATTNS}, got {self.attn!r}")
        if self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {self.padding!r}")
        if min(self.max_length, self.batch_size, self.epochs, self.eval_batch_size) < 1 or self.lr <= 0:
            raise ValueError(f"max_length, batch_size, epochs, eval_batch_size and lr must be positive: {self}")
        if self.max_length > 512:
            raise ValueError(f"max_length={self.max_length}: BERT has 512 positions")


def load_splits(cfg: FinetuneConfig, verbose: bool = True):
    """The corpus split train/val/test: the hub's copy when online, the bundled one offline."""
    from helpers.data import load_text_classification

    return load_text_classification("auto", seed=cfg.seed, max_examples=cfg.max_examples or None,
                                    verbose=verbose)


def tokenize_splits(splits: Any, tokenizer: Any, cfg: FinetuneConfig) -> dict[str, Any]:
    """{"train", "val", "test"}: each split tokenised (truncated to max_length, not padded)."""
    from helpers.data import tokenize

    return {name: tokenize(getattr(splits, name), tokenizer, max_length=cfg.max_length)
            for name in ("train", "val", "test")}


def make_batches(dataset: Any, cfg: FinetuneConfig, *, rank: int = 0, world_size: int = 1,
                 pad_token_id: int = 0) -> list[dict[str, torch.Tensor]]:
    """The training batches of every epoch, in order, for this process: padded to max_length (fixed) or
    to each batch's longest (bucketed); every process draws the same order and keeps every world_size-th."""
    from helpers.data import LengthBucketSampler, PadCollate

    collate = PadCollate(pad_token_id, cfg.max_length if cfg.padding == "fixed" else None)
    out: list[dict[str, torch.Tensor]] = []
    for epoch in range(cfg.epochs):
        if cfg.padding == "bucketed":
            sampler = LengthBucketSampler(dataset.lengths, cfg.batch_size, seed=cfg.seed, drop_last=True)
            sampler.set_epoch(epoch)
            groups = list(sampler)
        else:
            g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
            order = torch.randperm(len(dataset), generator=g).tolist()
            groups = [order[i:i + cfg.batch_size] for i in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size)]
        groups = groups[: len(groups) - len(groups) % world_size]  # every process takes as many steps
        out += [collate([dataset[i] for i in idx]) for idx in groups[rank::world_size]]
    if not out:
        raise ValueError(f"no full batch of {cfg.batch_size} x {world_size} processes in {len(dataset)} "
                         "training examples: lower batch_size or raise max_examples")
    return out


def build_model(cfg: FinetuneConfig, num_labels: int, verbose: bool = True):
    """(model, tokenizer): the pretrained classifier with the rung's attention implementation."""
    from helpers.models import load_bert

    torch.manual_seed(cfg.seed)  # the new classifier head starts the same in every run
    return load_bert(cfg.model_name, num_labels=num_labels, attn_implementation=cfg.attn, verbose=verbose)


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Any, *, batch_size: int = 64, precision: str = "fp32",
             device: torch.device | str = "cpu", pad_token_id: int = 0) -> tuple[float, list[int], list[int]]:
    """(accuracy, predictions, labels) over `dataset`, in batches sorted by length (less padding)."""
    from helpers.data import PadCollate
    from helpers.train import autocast_context

    device = torch.device(device)
    was_training = model.training
    model.eval()
    collate = PadCollate(pad_token_id)
    order = sorted(range(len(dataset)), key=lambda i: dataset.lengths[i])
    preds = [0] * len(dataset)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = collate([dataset[i] for i in idx])
        with autocast_context("bf16" if precision == "bf16" else "fp32", device):
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
        for i, p in zip(idx, logits.argmax(-1).tolist()):
            preds[i] = p
    model.train(was_training)
    labels = list(dataset.labels)
    return sum(p == y for p, y in zip(preds, labels)) / max(len(labels), 1), preds, labels


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
    """FLOP/s the hardware executed in steps 1.. (step 0 is warm-up and compilation): every position of
    each batch, padding included, at the batch's own width (`helpers.flops.model_flops_per_token`)."""
    from helpers.flops import model_flops_per_token

    if len(step_times_s) < 2:
        return 0.0
    flops = sum(b["input_ids"].numel() * model_flops_per_token(model, b["input_ids"].shape[1])
                for b in batches[1:len(step_times_s)])
    return flops / sum(step_times_s[1:])


def _default_peak(device: torch.device) -> float | None:
    """The dense bf16 datasheet peak of a known GPU, else a matmul roofline measured now (a CPU's)."""
    from helpers.hardware import measure_roofline
    from helpers.flops import peak_flops

    peak = peak_flops(device, "bf16")
    if peak is None:
        roof = measure_roofline(device, dtypes=["float32"] if device.type == "cpu" else None)
        peak = peak_flops(device, "fp32" if device.type == "cpu" else "bf16", roofline=roof)
    return peak.flops if peak is not None else None


def finetune(cfg: FinetuneConfig, *, log=print) -> dict[str, Any]:
    """Fine-tune as `cfg` says, in this process (and its torchrun peers); returns the measurements."""
    from helpers.data import padding_fraction
    from helpers.distributed import setup, teardown
    from helpers.train import TrainConfig, train

    env = setup(cfg.device, timeout_s=1800.0)  # rank 0 evaluates while the others wait at the barrier
    main_rank = env.rank == 0
    say = log if main_rank else (lambda *a, **k: None)
    try:
        t_start = time.perf_counter()
        splits = load_splits(cfg, verbose=main_rank)
        model, tokenizer = build_model(cfg, num_labels=splits.num_labels, verbose=main_rank)
        data = tokenize_splits(splits, tokenizer, cfg)
        batches = make_batches(data["train"], cfg, rank=env.rank, world_size=env.world_size,
                               pad_token_id=tokenizer.pad_token_id or 0)
        steps = min(len(batches), cfg.max_steps) if cfg.max_steps else len(batches)
        raw = model
        run: torch.nn.Module = model.to(env.device)
        if cfg.compile:
            run = torch.compile(run)
        if env.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            run = DDP(run, device_ids=[env.device.index] if env.device.type == "cuda" else None)
        tcfg = TrainConfig(steps=steps, lr=cfg.lr, weight_decay=cfg.weight_decay, precision=cfg.precision,
                           fused_adamw=cfg.fused_adamw, max_grad_norm=1.0, seed=cfg.seed,
                           checkpoint_dir=cfg.checkpoint_dir or None,
                           checkpoint_every=(cfg.checkpoint_every or steps) if cfg.checkpoint_dir else 0,
                           progress=main_rank, track_memory=True)
        say(f"finetune: {steps} steps of {cfg.batch_size} x {env.world_size} process(es) on {env.device}, "
            f"{cfg.precision}, attn={cfg.attn}, compile={cfg.compile}, fused={cfg.fused_adamw}, "
            f"padding={cfg.padding}")
        t_train = time.perf_counter()
        res = train(run, batches, tcfg, env.device)
        train_s = time.perf_counter() - t_train
        done = batches[(res.resumed_from or 0):(res.resumed_from or 0) + len(res.step_times_s)]
        job_flops_per_s = executed_flops_per_s(raw, done, res.step_times_s) * env.world_size
        peak = cfg.peak_flops or _default_peak(env.device)
        devices = env.world_size if env.device.type == "cuda" else 1  # CPU processes share one CPU
        result: dict[str, Any] = {"config": asdict(cfg), "world_size": env.world_size, "device": str(env.device),
                                  "model_source": getattr(raw, "course_source", "?"), "steps": res.steps_done,
                                  "resumed_from": res.resumed_from, "final_loss": res.final_loss,
                                  "losses": res.losses,
                                  "train_s": train_s,
                                  # every process handled as many samples: the job's throughput is world_size x
                                  "samples_per_s": res.samples_per_s * env.world_size,
                                  "tokens_per_s": res.tokens_per_s * env.world_size,
                                  "mfu": job_flops_per_s / (peak * devices) if peak and job_flops_per_s else None,
                                  "first_step_s": res.step_times_s[0] if res.step_times_s else None,
                                  "padding": padding_fraction(done) if done else None,
                                  "peak_memory_bytes": res.peak_memory_bytes}
        if main_rank:
            acc_val = evaluate(raw, data["val"], batch_size=cfg.eval_batch_size, precision=cfg.precision,
                               device=env.device)[0] if len(data["val"]) else None
            acc_test = evaluate(raw, data["test"], batch_size=cfg.eval_batch_size, precision=cfg.precision,
                                device=env.device)[0]
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
            say(f"finetune: test accuracy {acc_test:.4f}, {train_s:.1f} s training, "
                f"{result['samples_per_s']:.2f} samples/s")
        return result
    finally:
        teardown()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = FinetuneConfig()
    for f in fields(FinetuneConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument("--results-json", default="", help="write the result here (rank 0)")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry point (also under torchrun)."""
    args = vars(_parser().parse_args(argv))
    out = args.pop("results_json")
    result = finetune(FinetuneConfig(**args))
    if "test_accuracy" in result:  # rank 0
        print("RESULT " + json.dumps(result), flush=True)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
