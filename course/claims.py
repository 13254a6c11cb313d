"""The claims the lessons' summaries judge, each written once: what it says, its docs/claims.md anchor and
its rule (lessons 00-08). docs/claims.md holds each claim's sources and measured values."""

from __future__ import annotations

from course.verdicts import AtLeast, AtMost, Claim, Range

__all__ = ["CLAIMS"]

CLAIMS: dict[str, Claim] = {
    # lesson 00: the set-up
    "cuda-is-there": Claim("c10", "almost surely True"),
    "torch-cuda-pairs": Claim("c11", "PyTorch 2.7 pairs with CUDA 11.8 or 12.1"),
    "rtx4090-40gb": Claim("c8", "a 40 GB card"),
    "a100-cores": Claim("c9", "6,912"),
    "rtx3090-cores": Claim("c9", "10,496 cores, 24 GB"),
    # lesson 01: FlashAttention
    "flash-memory": Claim("c6", "≈ N: x below 1.5, memory", AtMost(1.5)),
    "flash-latency": Claim("c6", "> 1: lower latency", AtLeast(1.0)),
    # lesson 02: mixed precision
    "amp-speedup": Claim("c2", "1.5–2.3×", Range(1.5, 2.3)),
    "amp-memory": Claim("c2", "~40 %: 30–50 %", Range(0.3, 0.5)),
    "wide-amp": Claim("c3", "> 2×", AtLeast(2.0)),
    # lesson 03: memory
    "activations-16gb": Claim("c5", "> 16 GB", AtLeast(16)),
    "checkpointing-cost": Claim("c15", "about 1.3x: 1.15–1.45", Range(1.15, 1.45, better="lower")),
    # lesson 04: where the time goes (the share of a step's time, as a fraction)
    "matmul-time": Claim("c16", "~99 %, so that is where the time goes", AtLeast(0.90)),
    # lesson 05: torch.compile
    "compile-speedup": Claim("c4", "10–30 % faster: 1.10–1.30", Range(1.10, 1.30)),
    # lesson 06: the input pipeline
    "workers-needed": Claim("c10", "workers are needed: ≥ 1.05", AtLeast(1.05)),
    "copies-throttle": Claim("c10", "copies throttle training: ≥ 10 %", AtLeast(0.10)),
    "packing-gain": Claim("c12", "up to 2x: ≥ 1.5 on data with ≥ 30 % padding", AtLeast(1.5)),
    # lesson 07: DDP
    "ddp-averages": Claim("c7", "DDP averages gradients before optimizer.step()"),
    "ddp-traffic": Claim("c7", "traffic is half the parameter count: within 10 %",
                         Range(0.9, 1.1, better=None)),
    # lesson 08: the speed ladder
    "bert-stack": Claim("c1", "mixed precision + DDP: 2.5x over fp32 on a GPU", AtLeast(2.5)),
}
