"""A training step's time on a device's roofs (lessons 09, 10): each op at its roof (lesson 04's model), the
kernels against the host's issue time, and what the levers add: accumulation, data parallelism's collectives,
an optimizer offloaded to the CPU. `ASSUMED` says what it takes for granted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from helpers.measure.gpus import BETWEEN_NODES, GPU, Link
from helpers.measure.levers import Levers
from helpers.measure.opcount import OPTIMIZER_PHASE, OpCount, op_class
from helpers.measure.regimes import classify_regime, predicted_time
from helpers.measure.roofline import Roofline

__all__ = [
    "StepTime",
    "step_time",
    "communication",
    "ASSUMED",
    "HOST_ADAMW_PARAMS_S",
    "gpus_per_node",
]

_LINEAR_OPS = ("aten::mm", "aten::addmm", "aten::linear")  # what FP8 linears replace
# An optimizer offloaded to the CPU (FSDP2's CPUOffloadPolicy) steps there: AdamW on a server CPU reads and
# writes ~16 bytes per fp32 parameter; 1e9 parameters/s is ~16 GB/s of a host's memory bandwidth. A parameter:
# lesson 10 measures this machine's own rate.
HOST_ADAMW_PARAMS_S = 1e9
ASSUMED = (
    "a GPU queues kernels while the host issues the next: a step takes the longer of its kernels back to "
    "back "
    "and the host's issue time (op calls x the launch cost); a CPU runs each op before issuing the next",
    "data parallelism: ring collectives; an all-reduce moves 2(N-1)/N of the gradients' bytes per GPU, an "
    "all-gather or reduce-scatter (N-1)/N; within a box at the GPU's link bandwidth, across boxes at the "
    "between-node link's (a parameter)",
    "communication overlaps compute (FSDP's prefetch, DDP's buckets): the step is the longer of the two; the "
    "range's upper end adds them, as if nothing overlapped",
    "FSDP2 gathers the parameters in the compute precision (2 bytes in bf16/fp16) for the forward and again "
    "for the backward, and reduce-scatters fp32 gradients after every micro-batch",
    f"an offloaded optimizer steps on the CPU at {HOST_ADAMW_PARAMS_S:.0e} parameters/s (a parameter) after "
    f"the "
    "gradients travel to the host and before the parameters travel back, over the GPU's host link",
)


@dataclass(frozen=True)
class StepTime:
    """One optimizer step's predicted time on a device's roofs, and what it is made of (lessons 09, 10)."""

    seconds: float  # the step at the roofs: compute, the host's issue time and communication put together
    kernels_s: float  # every kernel at its roof, back to back (all micro-batches, the optimizer once)
    host_s: float  # the host's issue time: op calls x the per-call cost
    by_regime: dict[
        str, float
    ]  # "compute" / "memory" kernel seconds; "overhead": the host's time beyond them
    flops: float
    bytes: float
    kernels: int  # op calls that compute or move data
    communication_s: float = 0.0  # data parallelism's collectives in one step
    offload_s: float = 0.0  # an offloaded optimizer: transfers and the CPU's step
    upper_s: float = 0.0  # nothing overlapped: compute + communication + offload
    by_phase: dict[str, float] = field(default_factory=dict)  # kernel seconds per phase, one micro-batch

    @property
    def bound(self) -> str:
        """What sets the step's time: "kernels", "the host" or "communication"."""
        compute = max(self.kernels_s, self.host_s)
        if self.communication_s > compute:
            return "communication"
        return "the host" if self.host_s > self.kernels_s else "kernels"

    def share(self, regime: str) -> float:
        return self.by_regime.get(regime, 0.0) / self.seconds if self.seconds > 0 else 0.0


def _phase_times(
    counts: Mapping[tuple[str, str], OpCount], roofs: Roofline, precision: str, fp8: bool
) -> dict[str, dict[str, float]]:
    """Per phase: kernel seconds by regime, the host's seconds, FLOPs, bytes and kernels."""
    peak = roofs.peak(precision)
    fp8_peak = roofs.matmul_flops.get("fp8") if fp8 else None
    phases: dict[str, dict[str, float]] = {}
    for (ph, op), c in counts.items():
        if c.flops == 0 and c.bytes == 0:
            continue  # a view: no kernel
        if op_class(op, ph, is_view=c.is_view) == "communication":
            continue  # the collectives are priced from the links, below
        rate = peak if c.flops_source == "FlopCounterMode" else roofs.vector_rate
        if fp8_peak and op in _LINEAR_OPS:
            rate = fp8_peak
        bw = roofs.bandwidth_for(c.bytes / c.calls if c.calls else 0.0)
        t = phases.setdefault(
            ph, dict.fromkeys(("compute", "memory", "overhead", "host", "flops", "bytes", "kernels"), 0.0)
        )
        if roofs.synchronous:  # a CPU: each op's calls and work add (lesson 04)
            regime = classify_regime(
                c.flops, c.bytes, c.calls, peak_flops=rate, bandwidth=bw, overhead_s=roofs.overhead_s
            )
            t[regime] += predicted_time(
                c.flops,
                c.bytes,
                c.calls,
                peak_flops=rate,
                bandwidth=bw,
                overhead_s=roofs.overhead_s,
                synchronous=True,
            )
        else:  # a GPU: the kernel's time here, the launches summed apart (the queue hides them under kernels)
            work = {"compute": c.flops / rate, "memory": c.bytes / bw}
            regime = max(work, key=work.get)
            t[regime] += work[regime]
            t["host"] += c.calls * roofs.overhead_s
        t["flops"], t["bytes"], t["kernels"] = (
            t["flops"] + c.flops,
            t["bytes"] + c.bytes,
            t["kernels"] + c.calls,
        )
    return phases


def gpus_per_node(g: GPU) -> int:
    """GPUs one box holds: 8 of a board with NVLink (an HGX/DGX box), else as many as asked (lesson 10)."""
    return 8 if g.link is not None and g.link.kind.startswith("NVLink") else g.count


def communication(
    levers: Levers,
    g: GPU,
    *,
    trainable: int,
    parameters: int,
    compute_bytes: int = 2,
    grad_bytes: int = 4,
    between_nodes: Link = BETWEEN_NODES,
) -> tuple[float, str]:
    """(seconds of one optimizer step's collectives per GPU, the link they run over) for `trainable` and
    `parameters` counted in elements; ring collectives at the slowest link the ring crosses (lesson 10)."""
    n = levers.gpus
    if n == 1:
        return 0.0, "none"
    local = g.link if g.link is not None else between_nodes
    link = local if n <= max(gpus_per_node(g), 1) else min(local, between_nodes, key=lambda x: x.bandwidth)
    share = (n - 1) / n
    if levers.sharding == "full":  # FSDP2: gather for forward and backward, reduce-scatter, per micro-batch
        per_micro = 2 * share * parameters * compute_bytes + share * trainable * grad_bytes
        nbytes = levers.accumulation * per_micro
    else:  # DDP (and ZeRO-1: reduce-scatter + all-gather, the same bytes): once per step, after accumulating
        nbytes = 2 * share * trainable * grad_bytes
    return nbytes / link.bandwidth, link.kind


def step_time(
    counts: Mapping[tuple[str, str], OpCount],
    roofs: Roofline,
    precision: str,
    *,
    fp8: bool = False,
    levers: Levers | None = None,
    g: GPU | None = None,
    trainable: int = 0,
    parameters: int = 0,
    host_adamw_params_s: float = HOST_ADAMW_PARAMS_S,
) -> StepTime:
    """One optimizer step's seconds: `counts` (one micro-batch and the optimizer) at `roofs`, with `levers` on
    board `g` (`trainable`, `parameters`: element counts) (lessons 09, 10)."""
    levers = levers or Levers()
    if levers.gpus > 1 or levers.offload:
        if g is None or not trainable:
            raise ValueError("data parallelism or offload needs the board `g` and the trainable parameters")
    phases = _phase_times(counts, roofs, precision, fp8)
    k = levers.accumulation
    opt_share = 1 / levers.gpus if levers.sharding != "none" else 1.0
    weight = {ph: (opt_share if ph == OPTIMIZER_PHASE else k) for ph in phases}
    offload_s = 0.0
    if levers.offload:  # the optimizer's kernels leave the GPU: gradients down, the CPU's step, weights up
        weight[OPTIMIZER_PHASE] = 0.0
        mine = trainable * opt_share
        offload_s = mine * 4 / g.host_link.bandwidth * 2 + mine / host_adamw_params_s
    total = {
        key: sum(w * phases[ph][key] for ph, w in weight.items())
        for key in ("compute", "memory", "overhead", "host", "flops", "bytes", "kernels")
    }
    by_regime = {r: total[r] for r in ("compute", "memory", "overhead")}
    kernels_s = sum(by_regime.values())
    host_s = total["host"]
    if not roofs.synchronous and host_s > kernels_s:
        by_regime["overhead"] += host_s - kernels_s  # the queue runs dry: the host sets the pace
    compute_s = kernels_s if roofs.synchronous else max(kernels_s, host_s)
    comm_s, _ = (
        communication(levers, g, trainable=trainable, parameters=parameters)
        if g is not None
        else (0.0, "none")
    )
    seconds = max(compute_s, comm_s) + offload_s
    return StepTime(
        seconds,
        kernels_s,
        host_s,
        by_regime,
        total["flops"],
        total["bytes"],
        round(total["kernels"]),
        comm_s,
        offload_s,
        compute_s + comm_s + offload_s,
        {ph: t["compute"] + t["memory"] + t["overhead"] for ph, t in phases.items()},
    )
