"""Compile the course's Triton kernels ahead of time for GPUs this machine does not have (no GPU needed).

    python tests/tritoncompile.py < requests.json > results.json

Each request names a kernel of helpers/model/kernels (`attn_fwd`, `attn_bwd_dkdv`, `attn_bwd_dq`), a target
(compute capability as 75, 80, ...), an element type, the head dim, the tile configuration and the
switches; each result gives the shared memory one program needs (`metadata.shared`, what Triton checks a
launch against), how many tensor-core and FMA instructions its PTX has, and the seconds the compile took;
or, where the compile fails, the error.

A request may also give `launch`: the value each argument of the kernel had in a real launch (an int or a
float; a pointer as "aligned" or "unaligned", whether its address is a multiple of 16 bytes). The kernel is
then compiled as that launch specialises it (`specialise`): a launch does not compile the kernel bare, and
what it specialises changes the code. Ints divisible by 16 and 16-byte-aligned pointers carry
`tt.divisibility=16`, which lets Triton prove loads contiguous and aligned, vectorise them and pipeline them
with asynchronous copies: more shared memory (the forward at d=128 on sm_80: 163,840 B, where the bare
compile reports 98,304 B). Without `launch` it compiles the kernel bare (what a launch never does; kept to
show the difference).

Run as its own process by tests/test_triton_targets.py: a process that has imported triton with
TRITON_INTERPRET=1 (as the other kernel tests do) interprets kernels and cannot compile them. Only triton
is imported (the kernel files are loaded by path, not through `helpers`), so this runs with any installed
Triton the course supports: `triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(
"cuda", cc, 32), options=...)`, with constexprs and attrs keyed by the argument's position, as triton 3.3 to
3.9 take them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parents[1] / "helpers" / "model" / "kernels"
FILES = {"attn_fwd": "_triton_fwd.py", "attn_bwd_dkdv": "_triton_bwd.py", "attn_bwd_dq": "_triton_bwd.py"}
CONSTEXPR = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_MASK", "EVEN_N")
INTS = ("H", "TQ", "TK", "CAUSAL_OFFSET")
FP32_POINTERS = ("L", "D")  # the row statistics
# A tensor-core instruction: mma.sync (sm_80 on), wgmma.mma_async (sm_90); an FMA on the CUDA cores.
MMA = re.compile(r"^\s*(?:@%p\d+\s+)?(?:mma\.sync|wgmma\.mma_async)\b", re.M)
FMA = re.compile(r"^\s*(?:@%p\d+\s+)?fma\.rn\.f32\b", re.M)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_course_{name}", KERNEL_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _signature(names: list[str], dtype: str) -> dict[str, str]:
    def kind(n: str) -> str:
        if n in CONSTEXPR:
            return "constexpr"
        if n == "Mask":
            return "*i8"
        if n == "sm_scale":
            return "fp32"
        if n in FP32_POINTERS:
            return "*fp32"
        if n in INTS or n.startswith("stride"):
            return "i32"
        return "*" + dtype  # q, k, v, the output and the gradients
    return {n: kind(n) for n in names}


def specialise(names: list[str], signature: dict[str, str], launch: dict[str, object],
               ) -> tuple[dict[str, str], dict[tuple[int], int], dict[tuple[int], list]]:
    """(signature, constexprs, attrs) of the kernel as a launch with these argument values compiles it: the
    rule of Triton's launcher (`BaseBackend.get_int_specialization`, `get_tensor_specialization`,
    `parse_attr`; an int equal to 1 becomes the constant 1; floats and bools are not specialised)."""
    signature, constexprs, attrs = dict(signature), {}, {}
    divisible = [["tt.divisibility", 16]]
    for i, name in enumerate(names):
        if signature[name] == "constexpr" or name not in launch:
            continue
        value = launch[name]
        if isinstance(value, str):  # a pointer: "aligned" (a multiple of 16 bytes) or "unaligned"
            if value not in ("aligned", "unaligned"):
                raise ValueError(f"launch[{name!r}] must be 'aligned' or 'unaligned' for a pointer, "
                                 f"got {value!r}")
            if value == "aligned":
                attrs[(i,)] = divisible
        elif isinstance(value, bool) or isinstance(value, float):
            continue
        elif value == 1:
            signature[name], constexprs[(i,)] = "constexpr", 1
        else:
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = divisible
    return signature, constexprs, attrs


def compile_one(request: dict, modules: dict) -> dict:
    """One compile: request keys kernel, cc, dtype, head_dim, block_m, block_n, num_warps, num_stages, causal,
    has_mask, even_n (forward only); `launch` (optional): the argument values of the launch to compile as."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    raw = getattr(modules[FILES[request["kernel"]]], request["kernel"])
    fn = triton.runtime.jit.JITFunction(raw)
    names = fn.arg_names
    const = dict(HEAD_DIM=request["head_dim"], BLOCK_M=request["block_m"], BLOCK_N=request["block_n"],
                 CAUSAL=request["causal"], HAS_MASK=request["has_mask"])
    if "EVEN_N" in names:
        const["EVEN_N"] = request["even_n"]
    signature, constexprs, attrs = specialise(names, _signature(names, request["dtype"]),
                                              request.get("launch", {}))
    constexprs.update({(names.index(k),): v for k, v in const.items()})
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    start = time.perf_counter()
    try:
        options = {"num_warps": request["num_warps"], "num_stages": request["num_stages"]}
        kernel = triton.compile(src, target=GPUTarget("cuda", request["cc"], 32), options=options)
    except Exception as err:  # a compile that fails is a result too: the test names it
        return dict(request, error=f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}",
                    seconds=time.perf_counter() - start, triton=triton.__version__)
    seconds = time.perf_counter() - start
    ptx = kernel.asm["ptx"]
    return dict(request, shared=kernel.metadata.shared, mma=len(MMA.findall(ptx)), fma=len(FMA.findall(ptx)),
                seconds=seconds, triton=triton.__version__)


def _compile_in_worker(request: dict) -> dict:
    return compile_one(request, {name: _load(name) for name in set(FILES.values())})


def main() -> int:
    """Compile every request, on as many processes as the machine has cores, up to 2 (the course's CI
    machine has 2; a compile is single-threaded); the results in the requests' order."""
    from concurrent.futures import ProcessPoolExecutor

    requests = json.load(sys.stdin)
    # the slow ones (sm_75: tl.dot unrolled into FMAs) first, so that both processes finish together
    order = sorted(range(len(requests)), key=lambda i: requests[i]["cc"])
    with ProcessPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        done = dict(zip(order, pool.map(_compile_in_worker, [requests[i] for i in order])))
    json.dump([done[i] for i in range(len(requests))], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
