"""Checkpoints (lessons 03, 07, 08): atomic single files and sharded DCP folders, named by step, pruned,
resumed from; what `helpers.train.loop.train` and course/scripts/train_ddp.py save.
Guide: docs/library/train.md#helperstraincheckpoint"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.compat import unwrap_model
from helpers.measure.memory import tensor_bytes

# torch.distributed.checkpoint (DCP) is imported inside the two functions that write and read sharded
# checkpoints: 0.85 s on first import (2-core CPU, after `import torch`), paid only by FSDP runs

__all__ = ["CheckpointError", "CheckpointDiskFull", "checkpoint_name", "list_checkpoints",
           "latest_checkpoint", "is_due", "prune_checkpoints", "remove_stale_temporaries",
           "save_checkpoint", "load_checkpoint", "save_sharded", "load_sharded", "save_step", "resume_latest"]

CHECKPOINT_FORMAT = 1
_DONE_RE = re.compile(r"^step_(\d{6,})(\.pt)?$")  # a complete checkpoint: file or DCP folder
_TMP_FILE_RE = re.compile(r"^step_\d{6,}\.pt\.[A-Za-z0-9_]+\.tmp$")  # save_checkpoint's temporaries
_TMP_DIR_RE = re.compile(r"^step_\d{6,}\.tmp$")  # save_sharded's temporaries


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: incomplete, damaged, or of another model (lessons 07, 08)."""


class CheckpointDiskFull(OSError):
    """No room for a checkpoint: names the folder, the bytes needed and the bytes left (lessons 07, 08)."""


def _out_of_space(err: BaseException) -> bool:
    # ENOSPC (or a quota) anywhere in the chain: torch.save wraps it in a RuntimeError, DCP in the
    # per-rank failures of a CheckpointException
    todo, seen = [err], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint: {rank: (exception, trace)}
        if isinstance(failures, Mapping):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return False


def _state_bytes(state: Any) -> int:
    # bytes of the tensors: about what a checkpoint of them takes on disk
    try:
        return tensor_bytes(state)
    except (ValueError, RuntimeError):  # something it cannot count (e.g. a tensor subclass): no estimate
        return 0


def _disk_full(folder: Path, name: str, needed: int) -> CheckpointDiskFull:
    left = shutil.disk_usage(folder).free
    need = f"about {needed / 2**20:,.1f} MiB ({needed:,} bytes)" if needed else "an unknown amount"
    return CheckpointDiskFull(errno.ENOSPC, f"No space left on device for checkpoint {name} in {folder}: it "
                              f"needs {need}, {left / 2**20:,.1f} MiB ({left:,} bytes) are left there. The "
                              f"earlier checkpoints in {folder} are intact, nothing half-written was left: "
                              "free some space, keep fewer checkpoints (keep_checkpoints / --keep) or point "
                              "the checkpoint folder at a disk with room, then rerun: it resumes from the "
                              "newest checkpoint")


def checkpoint_name(step: int, *, sharded: bool = False) -> str:
    """The checkpoint's name after `step` steps: step_000004.pt, or step_000004 for DCP (lessons 07, 08)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return f"step_{step:06d}" + ("" if sharded else ".pt")


def list_checkpoints(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints in `folder` as (step, path), oldest first, no temporaries (lessons 07, 08)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _DONE_RE.match(p.name))
             and (p.is_dir() if m.group(2) is None else p.is_file())]
    return sorted(found)


def latest_checkpoint(folder: str | os.PathLike) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint in `folder`, or None (lessons 07, 08)."""
    found = list_checkpoints(folder)
    return found[-1] if found else None


def is_due(done: int, every: int, last: int) -> bool:
    """Save after `done` steps? Every `every`-th, and the `last`; never when every == 0 (lessons 07, 08)."""
    if every < 0:
        raise ValueError(f"checkpoint every {every} steps: use a positive number, or 0 for never")
    return every > 0 and (done % every == 0 or done == last)


def prune_checkpoints(folder: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints in `folder`; returns what it deleted (lessons 07, 08)."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the checkpoint to resume from), got {keep}")
    old = [p for _, p in list_checkpoints(folder)[:-keep]]
    for p in old:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return old


def remove_stale_temporaries(folder: str | os.PathLike, *, log: Any = print) -> list[Path]:
    """Remove what an interrupted save left in `folder` (this module's names only), saying so (lesson 07)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = sorted(p for p in folder.iterdir() if (_TMP_FILE_RE.match(p.name) and p.is_file())
                   or (_TMP_DIR_RE.match(p.name) and p.is_dir()))
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    if stale and log is not None:
        log(f"checkpoints: removed {len(stale)} unfinished temporary file(s) an interrupted save left in "
            f"{folder}: {', '.join(p.name for p in stale)}")
    return stale


def _signature(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler: torch.amp.GradScaler | None = None, step: int = 0, *,
                    scheduler: Any = None, extra: Mapping[str, Any] | None = None) -> Path:
    """Write a single-file checkpoint to `path` atomically: temporary file, fsync, rename (lessons 07, 08)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap_model(model)
    state = {
        "format": CHECKPOINT_FORMAT,
        "model_class": type(model).__name__,
        "signature": _signature(model),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "step": int(step),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "extra": dict(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" checkpoint
        os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old file or the new one
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if _out_of_space(err):  # torch says "unexpected pos"; the reason is further up its chain
            raise _disk_full(path.parent, path.name, _state_bytes(state)) from err
        raise
    return path


def _damaged(path: Path, err: BaseException) -> CheckpointError:
    size = path.stat().st_size if path.exists() else 0
    earlier = [p for s, p in list_checkpoints(path.parent) if p != path and p.name < path.name]
    what_now = (f"resume from the previous checkpoint {earlier[-1].name} (delete {path.name}, and the "
                f"newest complete one is used)" if earlier else f"delete {path} to start over")
    return CheckpointError(f"{path} ({size:,} bytes) is not a complete checkpoint ({type(err).__name__}: "
                           f"{str(err).splitlines()[0][:120] if str(err) else 'no data'}); it was cut "
                           f"short or damaged, e.g. by a copy that did not finish. To go on: {what_now}.")


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler: torch.amp.GradScaler | None = None, *, scheduler: Any = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load a single-file checkpoint into `model` (and optimizer, scaler, scheduler); returns its contents.
    CheckpointError (a ValueError) for a missing, damaged or foreign file (lessons 07, 08)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip (RuntimeError), garbage (UnpicklingError, KeyError), empty (EOF)
        raise _damaged(path, err) from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or "signature" not in state:
        raise CheckpointError(f"{path} is not a checkpoint written by "
                              f"helpers.train.checkpoint.save_checkpoint")
    model = unwrap_model(model)
    mine, theirs = _signature(model), state["signature"]
    if state["model_class"] != type(model).__name__ or mine != theirs:
        missing = sorted(set(mine) - set(theirs))[:3]
        unexpected = sorted(set(theirs) - set(mine))[:3]
        shapes = [f"{k}: {theirs[k]} vs {mine[k]}" for k in mine.keys() & theirs.keys()
                  if mine[k] != theirs[k]][:3]
        raise CheckpointError(f"{path} holds a checkpoint of another model ({state['model_class']}, "
                              f"{len(theirs)} tensors) than this {type(model).__name__} "
                              f"({len(mine)} tensors); missing {missing}, unexpected {unexpected}, "
                              f"different shapes {shapes}: "
                              "point checkpoint_dir at a new folder for a new model")
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        _restore_rng(state["rng"])
    return state


def _restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuple(rng["python"]))
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _as_tuple(x: Any) -> Any:
    # random.setstate wants tuples all the way down
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# --- FSDP: torch.distributed.checkpoint folders ------------------------------------------------------

def _rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank_{rank:05d}.pt"


def _host_state(scaler: Any, scheduler: Any) -> dict[str, Any]:
    # beside a rank's shards: its own RNG states (its own dropout masks), the scaler and the scheduler
    return {"rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None}


def save_sharded(folder: str | os.PathLike, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 *, extra: Mapping[str, Any] | None = None, scaler: torch.amp.GradScaler | None = None,
                 scheduler: Any = None) -> Path:
    """Each rank writes its shards (DCP) and its `rank_NNNNN.pt` to `folder/step_NNNNNN/`, renamed from .tmp
    when all are done (lessons 07, 08). A collective: call it on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    name = checkpoint_name(step, sharded=True)
    final, tmp = folder / name, folder / (name + ".tmp")
    model_sd, optim_sd = get_state_dict(model, optimizer)  # sharded: each rank holds its part
    on = dist.is_initialized()
    rank = dist.get_rank() if on else 0
    main = rank == 0
    try:
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)  # returns when all wrote
        own = _rank_file(tmp, rank)
        torch.save(_host_state(scaler, scheduler), own)
        with open(own, "rb+") as f:
            os.fsync(f.fileno())
        if main:
            (tmp / "meta.json").write_text(json.dumps({"step": int(step), "extra": dict(extra or {}),
                                                       "world_size": dist.get_world_size() if on else 1}))
    except BaseException as err:  # DCP raises a CheckpointException (a BaseException) on every rank
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        if _out_of_space(err):
            raise _disk_full(folder, name, _state_bytes([model_sd, optim_sd])) from err
        raise
    if on:
        dist.barrier()  # every rank's own file is on disk before the folder is called complete
    if main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # the folder appears complete, or not at all
    if on:
        dist.barrier()  # nobody reads the folder before rank 0 has renamed it
    return final


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 scaler: torch.amp.GradScaler | None = None, scheduler: Any = None,
                 restore_rng: bool = True, log: Any = print) -> dict[str, Any]:
    """Load a DCP folder into this run's shards and this rank's RNG, scaler and scheduler; {"step", "extra"}
    (lessons 07, 08). Call it on every rank; another world size reshards, RNG states stay as they are."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    meta = path / "meta.json"
    if not meta.is_file():
        raise CheckpointError(f"{path} is not a complete sharded checkpoint (no meta.json): delete it to "
                              "resume from the one before")
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the layout to load into (this run's shards)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    info = json.loads(meta.read_text())
    rank = dist.get_rank() if dist.is_initialized() else 0
    own = _rank_file(path, rank)
    host_file = own if own.is_file() else _rank_file(path, 0)
    if host_file.is_file():  # older folders (before issue 39) have none
        try:
            host = torch.load(host_file, map_location="cpu", weights_only=True)
        except Exception as err:
            raise _damaged(host_file, err) from err
        if scaler is not None and host.get("scaler") is not None:
            scaler.load_state_dict(host["scaler"])
        if scheduler is not None and host.get("scheduler") is not None:
            scheduler.load_state_dict(host["scheduler"])
        if restore_rng and host_file == own:
            _restore_rng(host["rng"])
        elif restore_rng and log is not None and rank == 0:
            log(f"checkpoints: {path.name} was written by {info.get('world_size')} ranks, this run has "
                f"{dist.get_world_size() if dist.is_initialized() else 1}: the model and optimizer are "
                "resharded, the random number generators keep their states")
    return {"step": int(info["step"]), "extra": info.get("extra", {})}


# --- what a training loop calls ------------------------------------------------------------------------

def _rank0_and_barrier() -> tuple[bool, Any]:
    on = dist.is_available() and dist.is_initialized()
    return (not on or dist.get_rank() == 0), (dist.barrier if on else (lambda: None))


def save_step(folder: str | os.PathLike, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *,
              scaler: torch.amp.GradScaler | None = None, scheduler: Any = None,
              extra: Mapping[str, Any] | None = None, sharded: bool = False, keep: int = 2) -> Path:
    """Save the state after `step` steps in `folder`, keep the newest `keep` (lessons 07, 08). Call it on
    every rank: sharded, each writes its shards; else rank 0 writes and the others wait."""
    main, barrier = _rank0_and_barrier()
    if sharded:  # a failure raises on every rank
        path = save_sharded(folder, step, model, optimizer, extra=extra, scaler=scaler, scheduler=scheduler)
    else:
        path = Path(folder) / checkpoint_name(step)
        failure = None
        if main:
            try:
                save_checkpoint(path, model, optimizer, scaler, step, scheduler=scheduler, extra=extra)
            except Exception as err:  # e.g. a full disk: the other ranks must hear of it, not wait forever
                failure = err
        _raise_on_every_rank(failure, path)
    if main:
        prune_checkpoints(folder, keep)
    barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
    return path


def _raise_on_every_rank(failure: Exception | None, path: Path) -> None:
    # rank 0 re-raises its error; the other ranks raise one naming it
    if dist.is_available() and dist.is_initialized():
        said = [None if failure is None else f"{type(failure).__name__}: {failure}"]
        dist.broadcast_object_list(said, src=0)  # also the barrier: every rank waits for rank 0's write
        if failure is None and said[0] is not None:
            raise RuntimeError(f"rank 0 could not write checkpoint {path}: {said[0]}")
    if failure is not None:
        raise failure


# the optimizer's settings a resumed run compares with the checkpoint's ("initial_lr": a scheduler's base)
SETTINGS = ("initial_lr", "lr", "weight_decay", "betas", "eps", "momentum", "dampening", "nesterov")
ON_CHANGED_SETTINGS = ("refuse", "checkpoint", "this run")


def _settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    # a scheduler's base learning rate stands for the learning rate
    out = []
    for group in optimizer.param_groups:
        keys = [k for k in SETTINGS if k in group and not (k == "lr" and "initial_lr" in group)]
        out.append({k: group[k] for k in keys})
    return out


def _changed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    return [f"group {i} {k}: {after[i][k]!r} in the checkpoint, {b[k]!r} in this run"
            for i, b in enumerate(before) if i < len(after)
            for k in b if k in after[i] and after[i][k] != b[k]]


def _settle_settings(optimizer: torch.optim.Optimizer, scheduler: Any, before: list[dict[str, Any]],
                     on_changed: str, log: Any) -> None:
    # after a load: settings that differ from this run's are refused, or kept as `on_changed` says
    changed = _changed(before, _settings(optimizer))
    if not changed:
        return
    if on_changed == "refuse":
        raise CheckpointError("the checkpoint's optimizer settings differ from this run's: "
                              + "; ".join(changed) + ". Resume with TrainConfig(on_changed_settings="
                              "'checkpoint') to keep the checkpoint's, or 'this run' to train on with the "
                              "new ones")
    if on_changed == "this run":
        for group, mine in zip(optimizer.param_groups, before):
            group.update(mine)
            if "initial_lr" in mine:
                group["lr"] = mine["initial_lr"]
        if scheduler is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups]
    log(f"resume: {'; '.join(changed)}: {on_changed}'s kept")


def resume_latest(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                  scaler: torch.amp.GradScaler | None = None, scheduler: Any = None, sharded: bool = False,
                  restore_rng: bool = True, log: Any = print,
                  on_changed_settings: str = "refuse") -> dict[str, Any] | None:
    """On start, on every rank: clear stale temporaries, load the newest checkpoint; {"step", "extra",
    "path"} or None (lessons 07, 08). Changed optimizer settings: `on_changed_settings` decides."""
    if on_changed_settings not in ON_CHANGED_SETTINGS:
        raise ValueError(f"on_changed_settings must be one of {ON_CHANGED_SETTINGS}, got "
                         f"{on_changed_settings!r}")
    main, barrier = _rank0_and_barrier()
    if main:
        remove_stale_temporaries(folder, log=log)
    barrier()
    found = latest_checkpoint(folder)
    if found is None:
        return None
    path = found[1]
    if path.is_dir() != sharded:
        kind = "a sharded (FSDP)" if path.is_dir() else "a single-file"
        run = "shards" if sharded else "does not shard"
        raise CheckpointError(f"{path} is {kind} checkpoint, but this run {run} its model: point it at "
                              "another folder")
    before = _settings(optimizer)
    if sharded:
        state = load_sharded(path, model, optimizer, scaler=scaler, scheduler=scheduler,
                             restore_rng=restore_rng, log=log)
    else:
        state = load_checkpoint(path, model, optimizer, scaler, scheduler=scheduler, restore_rng=restore_rng)
    _settle_settings(optimizer, scheduler, before, on_changed_settings, log)
    return {"step": int(state["step"]), "extra": state.get("extra", {}), "path": path}
