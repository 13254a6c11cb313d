"""helpers.train.checkpoint: atomic saves, one naming scheme, clear errors for damaged or foreign files, and
the
DCP flavour (here in one process; under FSDP in tests/test_train_ddp.py). CPU, tiny sizes."""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train import checkpoint as ck


def tiny_model(**overrides) -> SmallTransformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=32, max_len=8, d_model=16, n_heads=2, n_layers=1)
    return SmallTransformer(TransformerConfig(**{**cfg, **overrides}))


def test_names_listing_and_pruning(tmp_path):
    assert ck.checkpoint_name(4) == "step_000004.pt" and ck.checkpoint_name(4, sharded=True) == "step_000004"
    with pytest.raises(ValueError):
        ck.checkpoint_name(-1)
    model = tiny_model()
    for step in (2, 4, 10):
        ck.save_checkpoint(tmp_path / ck.checkpoint_name(step), model, step=step)
    (tmp_path / "step_000012.pt.abc.tmp").write_bytes(b"")  # unfinished: not a checkpoint
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [2, 4, 10]
    assert ck.latest_checkpoint(tmp_path) == (10, tmp_path / "step_000010.pt")
    assert ck.latest_checkpoint(tmp_path / "absent") is None
    assert [p.name for p in ck.prune_checkpoints(tmp_path, keep=2)] == ["step_000002.pt"]
    with pytest.raises(ValueError, match="keep"):
        ck.prune_checkpoints(tmp_path, keep=0)


def test_every_zero_means_never_and_the_last_step_is_always_saved():
    assert [d for d in range(1, 8) if ck.is_due(d, 3, last=7)] == [3, 6, 7]
    assert not any(ck.is_due(d, 0, last=7) for d in range(1, 8))
    with pytest.raises(ValueError, match="0 for never"):
        ck.is_due(1, -1, last=7)


def test_a_round_trip_restores_model_optimizer_scheduler_and_rng(tmp_path):
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.zeros(2, 8, dtype=torch.long), labels=torch.zeros(2, 8, dtype=torch.long)).loss.backward()
    opt.step()
    sched.step()
    path = ck.save_checkpoint(tmp_path / "step_000001.pt", torch.compile(model), opt, step=1, scheduler=sched,
                              extra={"losses": [1.5]})
    expected_random = torch.rand(3)
    other = tiny_model()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    state = ck.load_checkpoint(path, other, opt2, scheduler=sched2)
    assert state["step"] == 1 and state["extra"] == {"losses": [1.5]}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert sched2.last_epoch == 1 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(torch.rand(3), expected_random)  # the RNG continues where the saved run was


@pytest.mark.parametrize("content", [b"", b"garbage" * 20, "truncated"])
def test_a_damaged_file_is_named_with_what_to_do(tmp_path, content):
    model = tiny_model()
    ck.save_checkpoint(tmp_path / "step_000002.pt", model, step=2)
    path = ck.save_checkpoint(tmp_path / "step_000004.pt", model, step=4)
    path.write_bytes(path.read_bytes()[:500] if content == "truncated" else content)
    with pytest.raises(ck.CheckpointError) as info:
        ck.load_checkpoint(path, model)
    message = str(info.value)
    assert str(path) in message and "not a complete checkpoint" in message
    assert "previous checkpoint step_000002.pt" in message
    only = tmp_path / "alone" / "step_000001.pt"
    only.parent.mkdir()
    only.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="delete .* to start over"):
        ck.load_checkpoint(only, model)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    ck.save_checkpoint(path, tiny_model(d_model=32), step=3)
    with pytest.raises(ValueError, match="another model"):
        ck.load_checkpoint(path, tiny_model())
    assert ck.load_checkpoint(path, tiny_model(d_model=32))["step"] == 3
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by helpers.train.checkpoint"):
        ck.load_checkpoint(tmp_path / "foreign.pt", tiny_model())
    with pytest.raises(ValueError, match="no checkpoint file"):
        ck.load_checkpoint(tmp_path / "absent.pt", tiny_model())


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "step_000001.pt"
    model = tiny_model()
    ck.save_checkpoint(path, model, step=1)

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(path, model, step=2)
    monkeypatch.undo()
    assert ck.load_checkpoint(path, model)["step"] == 1
    assert os.listdir(tmp_path) == ["step_000001.pt"]


def test_stale_temporaries_only_of_this_writer_are_removed(tmp_path):
    names = ["step_000004.pt.x1y2.tmp", "step_000008.tmp", "other.tmp", "step_000004.pt", "step_4.pt.a.tmp"]
    for name in names:
        (tmp_path / name).mkdir() if name == "step_000008.tmp" else (tmp_path / name).write_bytes(b"x")
    lines = []
    removed = ck.remove_stale_temporaries(tmp_path, log=lines.append)
    assert sorted(p.name for p in removed) == ["step_000004.pt.x1y2.tmp", "step_000008.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["other.tmp", "step_000004.pt", "step_4.pt.a.tmp"]
    assert len(lines) == 1 and "removed 2" in lines[0]
    assert ck.remove_stale_temporaries(tmp_path, log=lines.append) == [] and len(lines) == 1


def test_sharded_checkpoint_round_trip_in_one_process(tmp_path):
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.zeros(2, 8, dtype=torch.long), labels=torch.zeros(2, 8, dtype=torch.long)).loss.backward()
    opt.step()
    path = ck.save_sharded(tmp_path, 3, model, opt, extra={"note": "x"})
    assert path.name == "step_000003" and ck.latest_checkpoint(tmp_path) == (3, path)
    other = tiny_model()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    opt2 = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    assert ck.load_sharded(path, other, opt2) == {"step": 3, "extra": {"note": "x"}}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    (path / "meta.json").unlink()
    with pytest.raises(ck.CheckpointError, match="not a complete sharded checkpoint"):
        ck.load_sharded(path, other, opt2)


def test_a_loop_s_two_calls_save_step_and_resume_latest(tmp_path):
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert ck.resume_latest(tmp_path, model, opt) is None  # a fresh start
    for step in (2, 4, 6):
        ck.save_step(tmp_path, step, model, opt, extra={"at": step}, keep=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [4, 6]
    (tmp_path / "step_000008.pt.x.tmp").write_bytes(b"half")
    lines = []
    other = tiny_model()
    state = ck.resume_latest(tmp_path, other, torch.optim.SGD(other.parameters(), lr=0.1), log=lines.append)
    assert state["step"] == 6 and state["extra"] == {"at": 6} and state["path"].name == "step_000006.pt"
    assert len(lines) == 1 and not (tmp_path / "step_000008.pt.x.tmp").exists()
    with pytest.raises(ck.CheckpointError, match="single-file checkpoint, but this run shards"):
        ck.resume_latest(tmp_path, model, opt, sharded=True)


# --- a full disk (issue 20): no real disk is filled; the writes fail as they do on a full one ---------------

class FullDisk(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does: OSError(ENOSPC)."""

    def __init__(self, f, room: int = 256) -> None:
        self.f, self.room, self.pos = f, room, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        self.pos += len(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.pos


def _fill_the_disk(monkeypatch) -> None:
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, FullDisk(f), *a, **k))


def _numbers(message: str) -> tuple[int, int]:
    needed, left = re.search(r"needs about [\d.,]+ MiB \(([\d,]+) bytes\), [\d.,]+ MiB \(([\d,]+) bytes\) "
                             r"are left", message).groups()
    return int(needed.replace(",", "")), int(left.replace(",", ""))


def test_a_full_disk_names_the_folder_the_bytes_needed_and_left(tmp_path, monkeypatch):
    from helpers.measure.memory import tensor_bytes

    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = ck.save_step(tmp_path, 1, model, opt)  # what the loop and train_ddp.py call
    _fill_the_disk(monkeypatch)
    with pytest.raises(ck.CheckpointDiskFull) as info:
        ck.save_step(tmp_path, 2, model, opt)
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert "unexpected pos" in str(err.__cause__)  # torch's own message, kept in the chain
    message = str(err)
    assert f"No space left on device for checkpoint step_000002.pt in {tmp_path}" in message
    needed, left = _numbers(message)
    assert needed >= tensor_bytes(model.state_dict()) + tensor_bytes(opt)
    assert abs(left - shutil.disk_usage(tmp_path).free) < 2**30
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [first.name]  # no temporary left, the earlier checkpoint intact
    other = tiny_model(d_model=16)
    assert ck.resume_latest(tmp_path, other, torch.optim.AdamW(other.parameters()), log=None)["step"] == 1


def test_a_full_disk_during_a_sharded_save_keeps_the_earlier_one(tmp_path, monkeypatch):
    import torch.distributed.checkpoint.filesystem as dcp_fs

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ck.save_step(tmp_path, 2, model, opt, sharded=True)

    @contextlib.contextmanager
    def full_stream(self, path, mode):
        with open(path, mode) as f:
            yield FullDisk(f)

    monkeypatch.setattr(dcp_fs.FileSystem, "create_stream", full_stream)
    with pytest.raises(ck.CheckpointDiskFull) as info:
        ck.save_step(tmp_path, 4, model, opt, sharded=True)
    assert f"checkpoint step_000004 in {tmp_path}" in str(info.value)
    assert _numbers(str(info.value))[0] > 0
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["step_000002"]  # the temporary folder is gone
    assert ck.load_sharded(tmp_path / "step_000002", model, opt)["step"] == 2


def _ddp_rank(rank: int, folder: str, results: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0:
        real_save = torch.save
        torch.save = lambda obj, f, *a, **k: real_save(obj, FullDisk(f), *a, **k)
    start = time.monotonic()
    try:
        ck.save_step(Path(folder) / "ckpt", 1, model, opt)
        outcome = "saved"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    Path(results, f"rank{rank}.txt").write_text(f"{time.monotonic() - start:.1f}\n{outcome}")
    dist.destroy_process_group()


def test_under_ddp_every_rank_hears_that_rank_0_ran_out_of_space(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_rank, args=(str(tmp_path), str(tmp_path)), nprocs=2, join=True)
    (t0, out0), (t1, out1) = ((tmp_path / f"rank{r}.txt").read_text().split("\n", 1) for r in range(2))
    assert out0.startswith("CheckpointDiskFull") and "No space left on device" in out0
    assert out1.startswith("RuntimeError: rank 0 could not write checkpoint") and "No space left" in out1
    assert float(t1) < 20, "rank 1 waited for a checkpoint that never came"
    assert os.listdir(tmp_path / "ckpt") == []


def test_helpers_train_stops_at_a_full_disk_with_the_clear_error(tmp_path, monkeypatch):
    from helpers.data.synthetic import synthetic_batch_fn
    from helpers.train.loop import TrainConfig, train

    real_save, calls = torch.save, []

    def full_after_the_first(obj, f, *a, **k):  # the disk fills up after the first checkpoint
        calls.append(1)
        return real_save(obj, f if len(calls) == 1 else FullDisk(f), *a, **k)

    monkeypatch.setattr(torch, "save", full_after_the_first)
    cfg = TrainConfig(steps=3, checkpoint_dir=str(tmp_path), checkpoint_every=1, progress=False,
                      track_memory=False)
    with pytest.raises(ck.CheckpointDiskFull, match=f"step_000002.pt in {re.escape(str(tmp_path))}"):
        train(tiny_model(), synthetic_batch_fn(32, 2, 8), cfg)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["step_000001.pt"]
    assert ck.load_checkpoint(tmp_path / "step_000001.pt", tiny_model())["step"] == 1
