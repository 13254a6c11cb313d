"""Accuracy and confusion matrix of a sequence classifier (lesson 08): forward passes only, batches sorted
by length (less padding, same predictions); a PackedModel is evaluated through the model it wraps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from helpers.core.device import get_device
from helpers.data.text import PadCollate
from helpers.model.packed_model import PackedModel
from helpers.train.runspec import RunSpec

__all__ = ["evaluate", "confusion_matrix"]


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Any, *, batch_size: int = 64, spec: RunSpec | None = None,
             device: torch.device | str | None = None,
             pad_token_id: int = 0) -> tuple[float, list[int], list[int]]:
    """(accuracy, predictions, labels) of a classifier over a tokenised dataset, under the spec's TF32 and
    autocast (lesson 08)."""
    model = model.model if isinstance(model, PackedModel) else model
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    spec = spec if spec is not None else RunSpec()
    device = get_device(str(device)) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    collate = PadCollate(pad_token_id)
    order = sorted(range(len(dataset)), key=lambda i: dataset.lengths[i])
    preds = [0] * len(dataset)
    with spec.step_context(device), spec.autocast(device):  # forward passes only: no backward here
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = {k: v.to(device) for k, v in collate([dataset[i] for i in idx]).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            for i, p in zip(idx, logits.argmax(-1).tolist()):
                preds[i] = p
    model.train(was_training)
    labels = [int(y) for y in dataset.labels]
    return sum(p == y for p, y in zip(preds, labels)) / max(len(labels), 1), preds, labels


def confusion_matrix(labels: Sequence[int], preds: Sequence[int], n_classes: int) -> list[list[int]]:
    """Counts [true class][predicted class] (lesson 08)."""
    if len(labels) != len(preds):
        raise ValueError(f"{len(labels)} labels for {len(preds)} predictions: give one prediction per label")
    if n_classes < 1:
        raise ValueError(f"n_classes must be at least 1, got {n_classes}")
    matrix = [[0] * n_classes for _ in range(n_classes)]
    for y, p in zip(labels, preds):
        if not (0 <= y < n_classes and 0 <= p < n_classes):
            raise ValueError(f"class {y if not 0 <= y < n_classes else p} is outside 0..{n_classes - 1}")
        matrix[y][p] += 1
    return matrix
