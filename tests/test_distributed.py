"""helpers.train.distributed: environment set-up without torchrun, the torchrun command line, and `launch`
(live per-rank output, failures reported with the failing rank's lines, timeouts that leave no process)."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from helpers.train import distributed as hd

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_backend_for_each_device() -> None:
    assert hd.backend_for("cpu") == "gloo"
    assert hd.backend_for(torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="meta"):
        hd.backend_for("meta")


def test_setup_without_torchrun_is_one_plain_process(no_torchrun: None) -> None:
    env = hd.setup("cpu")
    assert (env.rank, env.world_size, env.local_rank, env.distributed) == (0, 1, 0, False)
    assert env.device == torch.device("cpu") and env.backend == "gloo" and env.is_main
    assert not torch.distributed.is_initialized()
    hd.teardown()  # nothing to tear down: must not fail


def test_setup_rejects_bad_input(no_torchrun: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="device must be"):
        hd.setup("tpu")
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one'"):
        hd.setup("cpu")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK=2 must lie in \[0, WORLD_SIZE=2\)"):
        hd.setup("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_setup_cuda_without_gpu_says_so(no_torchrun: None) -> None:
    from helpers.core.device import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="CUDA was requested"):  # helpers.core.device's resolver
        hd.setup("cuda")


def test_ddp_and_fsdp_need_a_process_group(no_torchrun: None) -> None:
    env = hd.setup("cpu")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="torchrun"):
        hd.apply_ddp(model, env)
    with pytest.raises(ValueError, match="torchrun"):
        hd.apply_fsdp(model, env)


def test_grad_sync_uses_each_wrapper_s_switch() -> None:
    class FakeDDP(torch.nn.Module):
        def no_sync(self):
            return "no_sync context"

    class FakeFSDP(torch.nn.Module):
        synced = None

        def set_requires_gradient_sync(self, sync: bool) -> None:
            self.synced = sync

    assert hd.grad_sync(FakeDDP(), sync=False) == "no_sync context"
    assert hd.grad_sync(FakeDDP(), sync=True) != "no_sync context"
    fsdp = FakeFSDP()
    with hd.grad_sync(fsdp, sync=False):
        assert fsdp.synced is False
    with hd.grad_sync(torch.nn.Linear(1, 1), sync=False):  # one plain process: nothing to switch
        pass


def test_print0_prints_on_rank_0_only(no_torchrun: None, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    hd.print0("from zero")
    monkeypatch.setenv("RANK", "1")
    hd.print0("from one")
    assert capsys.readouterr().out == "from zero\n"


def test_get_logger_is_quiet_on_other_ranks(no_torchrun: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    assert hd.get_logger("course.test0").level == logging.INFO
    monkeypatch.setenv("RANK", "1")
    assert hd.get_logger("course.test1").level == logging.WARNING
    assert hd.get_logger("course.test1", all_ranks=True).level == logging.INFO
    assert len(hd.get_logger("course.test1").handlers) == 1  # no duplicate handler on a second call


def test_torchrun_command_single_node_and_multi_node(tmp_path: Path) -> None:
    one = hd.torchrun_command("train.py", ["--steps", "3"], nproc_per_node=2)
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in one and "--nproc-per-node=2" in one and one[-3:] == ["train.py", "--steps", "3"]
    two = hd.torchrun_command("train.py", nnodes=2, nproc_per_node=1, rdzv_endpoint="127.0.0.1:29400",
                              log_dir=tmp_path)
    assert "--standalone" not in two
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--tee=3"} <= set(two)
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        hd.torchrun_command("train.py", nnodes=2)
    with pytest.raises(ValueError, match="nproc_per_node"):
        hd.torchrun_command("train.py", nproc_per_node=0)


def test_free_port_is_bindable() -> None:
    import socket

    port = hd.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_launch_rejects_a_missing_script(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no script"):
        hd.launch(tmp_path / "absent.py")


# Worker scripts without torch, so each launch costs only torchrun's own start-up.
FAILING = textwrap.dedent("""
    import os, sys
    rank = int(os.environ["RANK"])
    print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}")
    if rank == 1:
        print("rank 1 is about to fail: boom")
        sys.exit(3)
""")
SLEEPING = textwrap.dedent("""
    import time
    print("started", flush=True)
    time.sleep(600)
""")


def test_launch_streams_each_rank_and_reports_the_failing_one(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    with pytest.raises(hd.LaunchError) as info:
        hd.launch(script, nproc_per_node=2, timeout_s=180)
    result = info.value.result
    assert result.returncode != 0
    assert result.rank_lines(0) == ["hello from rank 0 of 2"]
    assert result.rank_lines(1)[:2] == ["hello from rank 1 of 2", "rank 1 is about to fail: boom"]
    message = str(info.value)
    assert "first failing rank: 1" in message and "boom" in message
    printed = capsys.readouterr().out  # echoed live, with each line's rank
    assert "[rank0]:hello from rank 0 of 2" in printed and "[rank1]:rank 1 is about to fail: boom" in printed


def test_launch_workers_import_this_helpers_package(tmp_path: Path) -> None:
    script = tmp_path / "which.py"
    script.write_text("import os, helpers\nprint(os.environ['PYTHONPATH'])\nprint(helpers.__file__)\n")
    result = hd.launch(script, nproc_per_node=1, timeout_s=120, echo=False, env={"PYTHONPATH": "elsewhere"})
    root = Path(hd.__file__).resolve().parents[2]  # the folder that holds `helpers`, installed or not
    assert result.rank_lines(0) == [os.pathsep.join([str(root), "elsewhere"]),
                                    str(root / "helpers" / "__init__.py")]


def test_launch_timeout_raises_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPING)
    marker = uuid.uuid4().hex  # an argument that names this test's processes
    # 6 s: torchrun starts its two workers (which import nothing) in about 2 s on a quiet machine; on a busy
    # one torchrun's own start can take longer, and the launch is stopped again with more time, until the
    # workers were running when it was stopped (what this test is about)
    for timeout_s in (6, 20, 60):
        with pytest.raises(hd.LaunchError, match=f"timed out after {timeout_s} s") as info:
            hd.launch(script, [marker], nproc_per_node=2, timeout_s=timeout_s, echo=False)
        assert info.value.result.returncode != 0
        left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
        assert left == [], f"processes left behind: {left}"
        started = [line for line in info.value.result.lines if line.endswith("started")]
        if len(started) == 2:
            break
    assert len(started) == 2, f"the workers had not both started when the launch was stopped: {started}"


# --- FSDP2 averages gradients over ranks, as one process over the whole batch would --------------------

# The model and data both sides build: two blocks and a head, a global batch of 8 rows split between ranks.
FSDP_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            for block in self.blocks:
                x = torch.tanh(block(x))
            return self.head(x)

    def make():
        torch.manual_seed(0)
        model = Net()
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)
        return model, x, y

    def train(model, x, y, steps=3):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)  # mean over this process's rows
            loss.backward()
            opt.step()
            opt.zero_grad()
""")
FSDP_WORKER = FSDP_MODEL + textwrap.dedent("""
    import sys
    from helpers.train import distributed as hd

    env = hd.setup("cpu")
    model, x, y = make()
    half = x.shape[0] // env.world_size
    rows = slice(env.rank * half, (env.rank + 1) * half)  # this rank's part of the global batch
    model = hd.apply_fsdp(model, env)
    train(model, x[rows], y[rows])
    full = {name: p.full_tensor() for name, p in model.named_parameters()}  # all-gathered by every rank
    if env.rank == 0:
        torch.save(full, sys.argv[1])
    del model
    hd.teardown()
""")
FSDP_TOL = 1e-5  # fp32, 3 steps, 8x8 weights: one process and two differ only in summation order


def test_fsdp_on_gloo_gives_one_process_s_parameters(tmp_path: Path) -> None:
    """FSDP2 under 2 gloo ranks ends with the parameters one process reaches on the whole batch: gradients
    averaged over ranks, not summed (torch 2.7's gloo sums where FSDP asks for the average)."""
    script, out = tmp_path / "fsdp.py", tmp_path / "params.pt"
    script.write_text(FSDP_WORKER)
    hd.launch(script, [str(out)], nproc_per_node=2, timeout_s=240, echo=False, env={"OMP_NUM_THREADS": "1"})
    space: dict = {}
    exec(FSDP_MODEL, space)  # the same model and data, trained by this one process on all 8 rows
    model, x, y = space["make"]()
    space["train"](model, x, y)
    got = torch.load(out)
    for name, want in model.named_parameters():
        err = float((got[name].detach() - want.detach()).abs().max())
        assert err < FSDP_TOL, f"{name}: FSDP on 2 ranks differs from one process by {err:.2e} (a sum?)"


def _ev(name: str, start: float, end: float, device: str = "DeviceType.CPU") -> object:
    """A profiler event as comm_overlap reads it (times in µs)."""
    from types import SimpleNamespace

    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device)


BW = "autograd::engine::evaluate_function: MmBackward0"


def test_comm_overlap_on_gloo_counts_what_runs_beside_backward() -> None:
    events = [_ev(BW, 0, 100), _ev("autograd::engine::evaluate_function: AddBackward0", 20, 40),  # nested
              _ev(BW, 110, 200),
              _ev("c10d::allreduce_", 48, 49), _ev("c10d::allreduce_", 188, 189),  # the calls, in backward
              _ev("c10d::allreduce_", 205, 206),  # after backward's last op
              _ev("gloo:all_reduce", 50, 130),  # 50-100 and 110-130 beside backward, 100-110 not
              _ev("gloo:all_reduce", 190, 250),  # 190-200 beside backward
              _ev("gloo:all_reduce", 210, 260)]  # after backward: exposed
    o = hd.comm_overlap(events)
    assert (o.allreduces, o.launched_in_backward, o.overlapped, o.calls) == (3, 2, 2, 3)
    assert o.comm_s == pytest.approx(((130 - 50) + (260 - 190)) * 1e-6)  # the union, 250-260 counted once
    assert o.hidden_s == pytest.approx((50 + 20 + 10) * 1e-6)
    assert o.hidden_fraction == pytest.approx(80 / 150)
    late = hd.comm_overlap([_ev(BW, 0, 100), _ev("c10d::allreduce_", 100, 101),
                            _ev("gloo:all_reduce", 100, 180)])  # one bucket, called at the very end
    assert (late.launched_in_backward, late.overlapped, late.hidden_s, late.hidden_fraction) == (0, 0, 0, 0)
    assert hd.comm_overlap([_ev(BW, 0, 100)]).hidden_fraction == 0.0  # no communication at all


def test_comm_overlap_on_a_gpu_reads_the_kernels() -> None:
    cuda = "DeviceType.CUDA"
    events = [_ev(BW, 0, 30), _ev("c10d::allreduce_", 25, 26),  # CPU side: launches, ahead of the GPU
              _ev("ampere_sgemm_128x64_nn", 10, 60, cuda), _ev("ampere_sgemm_64x64_tn", 60, 90, cuda),
              _ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 120, cuda),
              _ev("gloo:all_reduce", 0, 1000)]  # ignored when NCCL kernels are present
    o = hd.comm_overlap(events)
    assert (o.allreduces, o.launched_in_backward, o.overlapped, o.calls) == (1, 1, 1, 1)
    assert o.comm_s == pytest.approx(80e-6) and o.hidden_s == pytest.approx(50e-6)
