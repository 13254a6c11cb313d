"""The levers of lesson 10 (helpers.measure.levers) and a `peft` model through the library (issue 49).

Each lever's dry run (`estimate_step_memory` on fake tensors) is held within 10 % of the peak a real step
measures on this CPU (`helpers.train.loop.train`'s reading: the profiler over the second step, the model's
and optimizer's tensors added): accumulation, checkpointing, 8-bit AdamW state, LoRA, and FSDP2 with 2 and 4
gloo processes per rank, with and without CPU offload (one torchrun launch per process count). Each test
prints both numbers, and a planted error (the dry run without the lever) fails the same check. On a CPU the
device and the host are one memory: offload is checked as the dry run's device + host against the measured
peak, and its host part against the bytes the rank keeps between steps.
"""

from __future__ import annotations

import json

import pytest
import torch
from fsdp_levers import batch, small_llama

from helpers.measure.memory import Levers, LoRA, estimate_step_memory

TOLERANCE = 0.10  # issue 49: each lever's dry run within 10 % of the measured peak
MiB = 2**20


def _within(estimated: int, measured: int, what: str) -> None:
    error = estimated / measured - 1
    print(f"{what}: dry run {estimated / MiB:.2f} MiB, measured {measured / MiB:.2f} MiB ({error:+.1%})")
    assert abs(error) <= TOLERANCE, f"{what}: the dry run is {error:+.1%} off the measured peak"


def _measured(model: torch.nn.Module, *, accum: int = 1, optimizer=None, spec=None) -> int:
    """The peak `train` reads on this CPU over its second step (of 2)."""
    from helpers.train.loop import TrainConfig, train

    result = train(model, [batch(i) for i in range(accum)],
                   TrainConfig(steps=2, grad_accum=accum, progress=False, peak_flops=1e11),
                   optimizer=optimizer, spec=spec)
    assert result.peak_memory_bytes, result.notes
    return result.peak_memory_bytes


def _dry(levers: Levers, model: torch.nn.Module | None = None, **kwargs) -> int:
    with torch.device("meta"):
        shape = small_llama() if model is None else model
    return estimate_step_memory(shape, batch(), **levers.kwargs(), **kwargs).peak


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread: on a busy 2-core machine, two threads per step ran ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plain() -> int:
    return _measured(small_llama())


def test_the_dry_run_of_a_plain_step_is_within_10_percent(plain):
    _within(_dry(Levers()), plain, "plain step")


def test_accumulation_holds_the_gradients_through_the_step(plain):
    measured = _measured(small_llama(), accum=4)
    _within(_dry(Levers(accumulation=4)), measured, "accumulation x4")
    assert measured > 1.1 * plain  # the gradients live beside the second micro-batch's activations
    with pytest.raises(AssertionError, match="off the measured"):  # planted: the lever left out
        _within(_dry(Levers()), measured, "accumulation x4, planted: counted as one pass")


def test_checkpointing_keeps_each_blocks_input_only():
    from helpers.train.runspec import RunSpec

    spec = RunSpec(activation_checkpointing=True)
    measured = _measured(spec.apply(small_llama()), spec=spec)
    _within(_dry(Levers(checkpointing=True)), measured, "activation checkpointing")
    with pytest.raises(AssertionError, match="off the measured"):
        _within(_dry(Levers()), measured, "checkpointing, planted: not applied")


def test_eight_bit_adamw_state_as_bitsandbytes_keeps_it():
    bnb = pytest.importorskip("bitsandbytes", reason="lesson 10's 8-bit AdamW comes with the course extra")
    from helpers.measure.levers import AdamW8bitState
    from helpers.measure.memory import tensor_bytes

    model = small_llama()
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    measured = _measured(model, optimizer=opt)
    # the state's layout, tensor by tensor: the dry run's stand-in against bitsandbytes' own
    twin = small_llama()
    stand_in = AdamW8bitState(twin.parameters(), kernels="cpu")
    for p in twin.parameters():
        p.grad = torch.zeros_like(p)
    stand_in.step()
    assert tensor_bytes(stand_in) == tensor_bytes(opt), (tensor_bytes(stand_in), tensor_bytes(opt))
    _within(_dry(Levers(optimizer="adamw8bit"), kernels="cpu"), measured, "8-bit AdamW (bitsandbytes, CPU)")
    with pytest.raises(AssertionError, match="off the measured"):
        _within(_dry(Levers(), kernels="cpu"), measured, "8-bit AdamW, planted: float32 state")


def test_lora_trains_the_adapters_only_and_its_dry_run_holds():
    peft = pytest.importorskip("peft", reason="lesson 10's LoRA comes with the course extra")
    base = small_llama().to(torch.bfloat16)  # the frozen base in 16 bits, the adapters float32
    model = peft.get_peft_model(base, LoRA().config())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    measured = _measured(model)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed), sorted(changed)[:5]
    _within(_dry(Levers(lora=LoRA())), measured, "LoRA r=8, bf16 base")
    # the same model handed to the dry run as it is (a peft model of one's own) counts the same
    with torch.device("meta"):
        meta = peft.get_peft_model(small_llama().to(torch.bfloat16), LoRA().config())
    _within(_dry(Levers(), model=meta), measured, "LoRA r=8, the peft model given")
    with pytest.raises(AssertionError, match="off the measured"):
        _within(_dry(Levers()), measured, "LoRA, planted: every weight trained in fp32")


# --- FSDP2 over gloo processes: one torchrun launch per process count ------------------------------------

@pytest.fixture(scope="module", params=[2, 4])
def ranks(request, tmp_path_factory) -> tuple[int, list[dict]]:
    from pathlib import Path

    from helpers.train.distributed import launch

    out = tmp_path_factory.mktemp(f"fsdp{request.param}")
    script = Path(__file__).with_name("fsdp_levers.py")
    launch(script, ["--out", str(out)], nproc_per_node=request.param, env={"OMP_NUM_THREADS": "1"},
           timeout_s=300, echo=False)
    return request.param, [json.loads((out / f"rank{r}.json").read_text()) for r in range(request.param)]


def test_fsdp2_per_rank_memory_from_the_dry_run(ranks):
    world, numbers = ranks
    dry = estimate_step_memory(_meta_llama(), batch(), shards=world)
    for r, n in enumerate(numbers):
        _within(dry.peak, n["sharded"]["peak"], f"FSDP2 over {world} gloo processes, rank {r}")
    with pytest.raises(AssertionError, match="off the measured"):  # planted: one unsharded device
        _within(_dry(Levers()), numbers[0]["sharded"]["peak"], f"FSDP2 x{world}, planted: not sharded")


def test_fsdp2_offload_splits_the_step_between_device_and_cpu(ranks):
    world, numbers = ranks
    dry = estimate_step_memory(_meta_llama(), batch(), shards=world, offload=True)
    # the device's peak and what the CPU held at that moment (on this CPU, one memory)
    both = dry.peak + sum(dry.at_peak.get(k, 0) for k in ("Sharded Param", "Sharded Grad", "OptState"))
    for r, n in enumerate(numbers):
        _within(both, n["offload"]["peak"], f"FSDP2 x{world} + offload, device and CPU, rank {r}")
        _within(dry.host, n["offload"]["kept"], f"FSDP2 x{world} + offload, the CPU's part, rank {r}")
    # at the peak the CPU held this rank's shards and optimizer state (its gradients come after)
    assert both - dry.peak >= 0.5 * dry.host, "offload left the device holding the shards and the state"
    with pytest.raises(AssertionError, match="off the measured"):  # planted: the device part alone
        _within(dry.peak, numbers[0]["offload"]["peak"], f"FSDP2 x{world} + offload, planted: device only")


def _meta_llama() -> torch.nn.Module:
    with torch.device("meta"):
        return small_llama()
