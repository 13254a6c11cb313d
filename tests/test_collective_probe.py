"""helpers.core.compat's reduce-scatter probe (FSDP2 set-up, lesson 07) runs on the process group's own
device.

An NCCL group has no CPU backend: a collective on CPU tensors raises "No backend type associated with device
type cpu". The fake group below refuses tensors on a device its backend cannot reduce, as NCCL does, and
remembers which device the probe asked for, so the check runs on a machine without a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers.core import compat

DEVICES = {"nccl": {"cuda"}, "gloo": {"cpu", "cuda"}}  # what each backend can reduce (torch's docs)


@pytest.fixture(autouse=True)
def _fresh_probe():
    compat._averages.cache_clear()  # the probe runs once per (backend, world): forget earlier groups
    yield
    compat._averages.cache_clear()


def _fake_group(monkeypatch, backend: str, world: int = 2, sums: bool = False) -> list[torch.device]:
    """A default process group of `world` ranks on `backend`, seen from rank 0; returns the devices of the
    tensors the probe handed to the collective."""
    asked: list[tuple[torch.Tensor, torch.device]] = []  # each tensor made, and the device asked for

    def remember(make):
        def made(*args, device=None, **kwargs):
            t = make(*args, **kwargs)  # on the CPU: this machine may have no GPU
            asked.append((t, torch.device(device if device is not None else "cpu")))
            return t
        return made

    seen: list[torch.device] = []

    def reduce_scatter_tensor(out, inp, op=None):
        for t in (out, inp):
            device = next((d for made, d in asked if made is t), t.device)
            if device.type not in DEVICES[backend]:
                raise RuntimeError(f"No backend type associated with device type {device.type}")
            seen.append(device)
        assert op == dist.ReduceOp.AVG
        mean = (world + 1) / 2  # ranks send 1..world
        out.fill_(mean * world if sums else mean)  # torch 2.7's gloo summed where AVG was asked

    monkeypatch.setattr(torch, "full", remember(torch.full))
    monkeypatch.setattr(torch, "empty", remember(torch.empty))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # this rank's GPU (LOCAL_RANK 1)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "reduce_scatter_tensor", reduce_scatter_tensor)
    return seen


def test_the_probe_on_an_nccl_group_runs_on_this_rank_s_gpu(monkeypatch):
    seen = _fake_group(monkeypatch, "nccl")
    assert compat.reduce_scatter_averages() is True  # CPU tensors would raise, as NCCL does
    assert seen == [torch.device("cuda", 1)] * 2


def test_the_probe_on_gloo_stays_on_the_cpu_and_sees_a_sum(monkeypatch):
    seen = _fake_group(monkeypatch, "gloo", world=4, sums=True)
    assert compat.reduce_scatter_averages() is False
    assert seen == [torch.device("cpu")] * 2
