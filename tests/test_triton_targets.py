"""The Triton kernels compiled ahead of time for the GPUs learners have, on a machine without one.

Every tile configuration the course launches (`helpers.model.kernels.configs.course_launches`: each kernel,
each
head dim it is planned for, each configuration the planning function offers) is compiled for sm_75 (T4),
sm_80 (A100), sm_86 (RTX 3090), sm_89 (RTX 4090, L4) and sm_90 (H100, H200), and the shared memory one
program needs (`metadata.shared`: what Triton checks a launch against) must be within the architecture's
per-block limit. The limits are NVIDIA's: CUDA C++ Programming Guide, "Compute Capabilities", Table 31
"Memory Information per Compute Capability", row "Maximum amount of shared memory per thread block"
(https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html): 64 KB on
sm_75, 163 KB on sm_80, 99 KB on sm_86 and sm_89, 227 KB on sm_90. The planted case, the one backward
configuration the course had before it planned per architecture (64x64 tiles, 8 warps, 2 stages, head
dim 128), needs more than sm_75's 64 KB, and the same check fails it.

Compiled as a launch compiles them: a launch specialises the kernel on its arguments (16-byte-aligned
pointers and ints divisible by 16 get `tt.divisibility=16`, ints equal to 1 become constants), and that
lets Triton vectorise and pipeline the loads, which takes more shared memory. So each kernel is compiled
with the argument values of a real launch, recorded from `flash_attention` itself (`_recorded_launches`:
contiguous tensors, 16 heads, 272 tokens: a multiple of 16 as the lessons' lengths are, and not of the
tiles, so the last tile is partial as the compiled variant assumes). A test checks that this specialisation
is the installed Triton's own, and the planted case of the specialisation: the bare compile the test made
before reports 98,304 B for the forward's largest tile on sm_80 where a launch needs 163,840 B, so it passed
that tile on sm_86 (99 KB), where no launch of it can run.

Which Triton: the installed one (its version is in every result and in the failure messages). Written with
triton 3.9; the same requests were compiled with triton 3.6 (what the GPU box runs), 3.5 and 3.4 (sm_75: the
same shared memory as 3.9) and with 3.3.1, the course's floor, where every sm_80-90 configuration compiles and
fits but every fp16 `tl.dot` for sm_75 fails ("Unsupported conversion from f16 to f16",
triton-lang/triton#6698, fixed by 3.4): there the course refuses the kernel on a T4, naming the triton it
needs (`compat.triton_compiles_for`), and the sm_75 tests check that every sm_75 compile fails as that says,
then skip the shared memory and instruction counts they cannot read. `tritoncompile.py` calls only
`triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cc, 32), options=...)`,
which those versions share (the shared memory of the specialised compiles was measured with triton 3.9).

Cost: each (kernel, configuration, architecture) is compiled once per session, in one subprocess (this
process interprets kernels), and every test reads the same results. sm_75 compiles are the slow ones (tl.dot
becomes thousands of FMAs there). Triton caches compiled kernels on disk (~/.triton/cache), so a second run
costs seconds.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import tritoncompile  # tests/tritoncompile.py: imports triton only when it compiles

from helpers.core import compat
from helpers.model.kernels import configs as tiles
from helpers.model.kernels import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (Linux only)")

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "tritoncompile.py"
KiB = 1024
# NVIDIA's table, restated here so that a wrong value in helpers/model/kernels/configs.py fails this test
GUIDE_LIMITS = {75: 64 * KiB, 80: 163 * KiB, 86: 99 * KiB, 89: 99 * KiB, 90: 227 * KiB}
TARGETS = sorted(GUIDE_LIMITS)
# What each architecture runs (the course's precision per capability): fp16 on sm_75, bf16 from sm_80
DTYPE = {75: "fp16", 80: "bf16", 86: "bf16", 89: "bf16", 90: "bf16"}
ALL_ON = dict(causal=True, has_mask=True, even_n=False)  # every switch that adds work to the loop
OLD_BACKWARD = tiles.TileConfig(64, 64, 8, 2)  # the one backward configuration at d=128 before the plan


def _cc(capability: tuple[int, int]) -> int:
    return capability[0] * 10 + capability[1]


def _request(kernel: str, cc: int, d: int, config: tiles.TileConfig, dtype: str | None = None,
             specialised: bool = True, **switches: bool) -> dict:
    """A compile request; `specialised`: compiled as a launch specialises it (the fixture adds the launch's
    argument values), else bare (what no launch compiles)."""
    return dict(kernel=kernel, cc=cc, dtype=dtype or DTYPE[cc], head_dim=d, block_m=config.block_m,
                block_n=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages,
                specialised=specialised, **(switches or ALL_ON))


def _key(r: dict) -> tuple:
    return tuple(r[k] for k in ("kernel", "cc", "dtype", "head_dim", "block_m", "block_n", "num_warps",
                                "num_stages", "causal", "has_mask", "even_n", "specialised"))


PLANNED = [_request(kernel, _cc(cc), d, config)
           for (kernel, cc, d), configs in tiles.course_launches().items() for config in configs]
PLANTED = _request("attn_bwd_dq", 75, 128, OLD_BACKWARD)
SWITCHES_OFF = _request("attn_fwd", 80, 128, tiles.tile_configs("attn_fwd", (8, 0), 128)[0],
                        causal=False, has_mask=False, even_n=True)
FP16_ON_SM80 = _request("attn_fwd", 80, 128, tiles.tile_configs("attn_fwd", (8, 0), 128)[0], dtype="fp16")
# the forward's largest tile at d=128 (offered where a block may have 160 KB or more), compiled as a launch
# compiles it and bare (the test's compile before), for sm_80 and for sm_86, which does not offer it
BIG_FORWARD = tiles.TileConfig(128, 128, 8, 3)
BIG_ON = {(cc, specialised): _request("attn_fwd", cc, 128, BIG_FORWARD, specialised=specialised)
          for cc in (80, 86) for specialised in (True, False)}
LAUNCH_SEQ, LAUNCH_HEADS = 272, 16  # a multiple of 16, as the lessons' lengths are; not one of the tiles


class _Recorder:
    """Stands in for a compiled kernel: `kernel[grid](*args, **kwargs)` records the launch, runs nothing."""

    def __init__(self, name: str, launches: list, configs: object = None) -> None:
        self.name, self.launches, self.configs = name, launches, configs

    def __getitem__(self, grid: object):
        return lambda *args, **kwargs: self.launches.append((self.name, self.configs, args, kwargs))


def _launch(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], dtype: torch.dtype, d: int,
            seq: int = 40, heads: int = 2) -> list[tuple[str, object, tuple, dict]]:
    """flash_attention's forward and backward launches on a GPU of `capability`, recorded on CPU tensors
    (causal, with a padding mask): [(kernel, its autotuned configs or None, args, kwargs)]."""
    fa = importlib.import_module("helpers.model.kernels.flash_attention")
    launches: list = []
    monkeypatch.setattr(fa, "_fwd_kernel",
                        lambda interpret, configs: _Recorder("attn_fwd", launches, configs))
    monkeypatch.setattr(fa, "_bwd_kernels", lambda interpret: (_Recorder("attn_bwd_dkdv", launches),
                                                               _Recorder("attn_bwd_dq", launches)))
    monkeypatch.setattr(fa, "_capability", lambda device: capability)
    q = torch.zeros(1, heads, seq, d, dtype=dtype)
    mask = torch.ones(1, seq, dtype=torch.int8)
    fa._forward(q, q.clone(), q.clone(), mask, True, d ** -0.5, None, None, False)
    fa._backward(q, q, q, q, q, torch.zeros(heads, seq), mask, True, d ** -0.5, False)
    return launches


def _arg_names(kernel: str) -> list[str]:
    module = importlib.import_module("helpers.model.kernels._triton_bwd" if "bwd" in kernel else
                                     "helpers.model.kernels._triton_fwd")
    return list(inspect.signature(getattr(module, kernel)).parameters)


def _launch_values(args: tuple, names: list[str]) -> dict[str, object]:
    """A launch's positional arguments as tritoncompile takes them: ints and floats as they are, a pointer as
    whether its address is a multiple of 16 bytes."""
    return {name: (("aligned" if value.data_ptr() % 16 == 0 else "unaligned") if torch.is_tensor(value)
                   else value) for name, value in zip(names, args)}


def _recorded_launches() -> dict[tuple[str, int], dict[str, object]]:
    """{(kernel, head dim): the argument values of a launch of the course's kernels at LAUNCH_SEQ tokens}."""
    out = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for d in tiles.GPU_HEAD_DIMS:
            for name, _, args, _ in _launch(monkeypatch, (8, 0), torch.bfloat16, d, LAUNCH_SEQ, LAUNCH_HEADS):
                out[(name, d)] = _launch_values(args, _arg_names(name))
    return out


@pytest.fixture(scope="session")
def compiled() -> dict[tuple, dict]:
    """Every request compiled once, in one subprocess: {request key: result}."""
    launches = _recorded_launches()
    requests = list({_key(r): r for r in [*PLANNED, PLANTED, SWITCHES_OFF, FP16_ON_SM80,
                                          *BIG_ON.values()]}.values())
    requests = [dict(r, launch=launches[(r["kernel"], r["head_dim"])]) if r["specialised"] else r
                for r in requests]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset; the default
    done = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(requests), capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return {_key(r): r for r in json.loads(done.stdout)}


def fits(result: dict) -> str | None:
    """None when the compiled program's shared memory is within its architecture's per-block limit, else
    what it needs and the limit (or why it did not compile)."""
    if "error" in result:
        return (f"{result['kernel']} d={result['head_dim']} does not compile for sm_{result['cc']} with "
                f"triton {result['triton']}: {result['error']}")
    limit = GUIDE_LIMITS[result["cc"]]
    if result["shared"] <= limit:
        return None
    return (f"{result['kernel']} {result['block_m']}x{result['block_n']}, {result['num_warps']} warps, "
            f"{result['num_stages']} stages, d={result['head_dim']} needs {result['shared']} B of shared "
            f"memory per block on sm_{result['cc']}, whose limit is {limit} B (triton {result['triton']})")


def test_the_plan_uses_nvidias_limits() -> None:
    for cc in TARGETS:
        assert tiles.shared_memory_per_block((cc // 10, cc % 10)) == GUIDE_LIMITS[cc], cc
    assert tuple(_cc(cc) for cc in tiles.COMPILED_TARGETS) == tuple(TARGETS)


@pytest.mark.parametrize("cc", TARGETS)
def test_every_planned_config_fits_its_architecture(compiled: dict, cc: int) -> None:
    compiles, why = compat.triton_compiles_for((cc // 10, cc % 10))
    if not compiles:  # the course refuses the kernel there, saying so (next test); nothing to fit
        assert tiles.gpu_refusal((cc // 10, cc % 10), torch.float16, 128) == why
        pytest.skip(why)
    mine = [compiled[_key(r)] for r in PLANNED if r["cc"] == cc]
    assert {(r["kernel"], r["head_dim"]) for r in mine} == {(k, d) for k in tiles.KERNELS
                                                            for d in tiles.GPU_HEAD_DIMS}
    too_big = [why for why in map(fits, mine) if why]
    assert not too_big, "\n".join(too_big)


def _refused_by_this_triton(results: list[dict], cc: int) -> None:
    """Where the installed triton cannot compile fp16 `tl.dot` for `cc` (triton 3.3 for sm_75,
    `compat.triton_compiles_for`), every compile of it must fail, as that claim says, and the test skips what
    it cannot measure, saying why; where it can, nothing happens."""
    compiles, why = compat.triton_compiles_for((cc // 10, cc % 10))
    if compiles:
        return
    built = [r for r in results if "error" not in r]
    assert not built, (f"triton {built[0]['triton']} compiled {built[0]['kernel']} for sm_{cc}, which "
                       f"helpers.core.compat says it cannot ({why}): correct triton_compiles_for")
    pytest.skip(f"{why}: nothing compiles for sm_{cc} to measure (each request failed, as compat says)")


def test_the_old_backward_config_fails_on_sm75(compiled: dict) -> None:
    """The planted case: the check above fails today's-before backward config on a T4 (with a triton that
    compiles for sm_75 at all: 3.4 on)."""
    planted = compiled[_key(PLANTED)]
    assert OLD_BACKWARD not in tiles.tile_configs("attn_bwd_dq", (7, 5), 128)
    _refused_by_this_triton([planted], 75)
    assert "error" not in planted, fits(planted)
    why = fits(planted)
    assert why is not None and "limit is 65536 B" in why, why


def test_the_compile_specialises_the_kernels_as_tritons_launcher_does() -> None:
    """The argument values of a recorded launch, specialised by tritoncompile.specialise, give the signature,
    constants and attributes the installed Triton's launcher derives from the same values (its
    `native_specialize_impl` and `parse_attr`). Planted: the bare compile (no launch values) differs."""
    jit = pytest.importorskip("triton.runtime.jit")
    if not hasattr(jit, "native_specialize_impl"):
        pytest.skip("this Triton has no native_specialize_impl to compare with (triton 3.9 has)")
    from triton.backends.compiler import BaseBackend

    def tritons(args: tuple, names: list[str], types: dict[str, str]) -> tuple[dict, dict, dict]:
        signature, constexprs, attrs = dict(types), {}, {}
        for i, (name, value) in enumerate(zip(names, args)):
            kind, spec = jit.native_specialize_impl(BaseBackend, value, False, True, True)
            if kind == "constexpr":
                signature[name], constexprs[(i,)] = "constexpr", value
                continue
            if not kind.startswith("*"):  # a pointer keeps the dtype the request names (fp16 or bf16)
                signature[name] = kind
            if isinstance(spec, str) and BaseBackend.parse_attr(spec):
                attrs[(i,)] = BaseBackend.parse_attr(spec)
        return signature, constexprs, attrs

    with pytest.MonkeyPatch.context() as monkeypatch:
        recorded = _launch(monkeypatch, (8, 0), torch.bfloat16, 128, LAUNCH_SEQ, LAUNCH_HEADS)
    for name, _, args, _ in recorded:
        names = _arg_names(name)
        types = tritoncompile._signature(names, "bf16")
        ours = tritoncompile.specialise(names, types, _launch_values(args, names))
        assert ours == tritons(args, names, types), name
        assert ours[2], f"{name}: a launch of contiguous tensors marks its pointers and strides divisible"
        assert tritoncompile.specialise(names, types, {}) != ours  # planted: the bare compile


def test_a_bare_compile_understates_what_a_launch_needs(compiled: dict) -> None:
    """The planted case of the specialisation: compiled bare, the forward's largest tile at d=128 reports
    less shared memory than a launch needs, and so fits sm_86's 99 KB, where no launch of it can run; compiled
    as a launch compiles it, the fit check refuses it there, and it still fits sm_80's 163 KB."""
    bare80, launched80 = compiled[_key(BIG_ON[(80, False)])], compiled[_key(BIG_ON[(80, True)])]
    bare86, launched86 = compiled[_key(BIG_ON[(86, False)])], compiled[_key(BIG_ON[(86, True)])]
    assert launched80["shared"] > bare80["shared"], (bare80["shared"], launched80["shared"])
    assert fits(bare86) is None  # what the test before this one accepted
    why = fits(launched86)
    assert why is not None and "limit is 101376 B" in why, why
    assert fits(launched80) is None, fits(launched80)
    assert BIG_FORWARD not in tiles.tile_configs("attn_fwd", (8, 6), 128)
    assert BIG_FORWARD in tiles.tile_configs("attn_fwd", (8, 0), 128)


def test_what_is_compiled_is_what_fits_the_variants_and_dtypes_launched(compiled: dict) -> None:
    """The plan is compiled with every switch on and in the dtype each architecture runs; checked once:
    switching them off needs no more shared memory, and fp16 needs what bf16 does (both 2 bytes)."""
    on = compiled[_key(_request("attn_fwd", 80, 128, tiles.tile_configs("attn_fwd", (8, 0), 128)[0]))]
    off, fp16 = compiled[_key(SWITCHES_OFF)], compiled[_key(FP16_ON_SM80)]
    assert not any("error" in r for r in (on, off, fp16)), [fits(r) for r in (on, off, fp16)]
    assert off["shared"] <= on["shared"] and fp16["shared"] == on["shared"]


@pytest.mark.parametrize("cc", TARGETS)
def test_tl_dot_is_on_tensor_cores_from_sm80_and_on_fmas_below(compiled: dict, cc: int) -> None:
    """Lesson 01's claim, per target: the PTX of every kernel has mma instructions (mma.sync; wgmma on
    sm_90) from sm_80 on, and none on sm_75, where tl.dot becomes FMAs on the CUDA cores (with a triton that
    compiles for sm_75 at all: 3.4 on)."""
    _refused_by_this_triton([compiled[_key(r)] for r in PLANNED if r["cc"] == cc], cc)
    for r in (compiled[_key(r)] for r in PLANNED if r["cc"] == cc):
        assert "error" not in r, fits(r)
        name = f"{r['kernel']} d={r['head_dim']} {r['block_m']}x{r['block_n']} (triton {r['triton']})"
        if cc < 80:
            assert r["mma"] == 0 and r["fma"] > 1000, f"{name} on sm_{cc}: {r['mma']} mma, {r['fma']} FMA"
        else:
            assert r["mma"] > 0, f"{name} on sm_{cc}: no tensor-core instruction in the PTX"


def test_the_launch_uses_the_planned_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """flash_attention on a (faked) T4 and A100 launches exactly what tile_configs planned: the forward
    autotuned over the plan, each backward kernel with the plan's first config (kernels replaced by
    recorders: nothing runs)."""
    for capability, dtype in (((7, 5), torch.float16), ((8, 0), torch.bfloat16)):
        for d in tiles.GPU_HEAD_DIMS:
            fwd, bwd_dkdv, bwd_dq = _launch(monkeypatch, capability, dtype, d)
            fwd_configs, dkdv, dq = fwd[1], bwd_dkdv[3], bwd_dq[3]
            assert fwd_configs == tiles.tile_configs("attn_fwd", capability, d)
            for name, kw in (("attn_bwd_dkdv", dkdv), ("attn_bwd_dq", dq)):
                planned = tiles.tile_configs(name, capability, d)[0]
                got = tiles.TileConfig(kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"])
                assert got == planned, (name, capability, d)


def test_the_plan_follows_the_per_block_limit_and_refuses_what_it_does_not_plan() -> None:
    """The 128x128 forward tile (160 KB on sm_80) is offered only where a block may have 160 KB or more;
    Turing gets its own smaller tiles; an sm_80+ GPU the table does not list gets the smallest listed limit;
    below sm_75 and outside the planned head dims there is no plan."""
    big = BIG_FORWARD
    for cc, offered in (((8, 0), True), ((9, 0), True), ((8, 6), False), ((8, 9), False)):
        assert (big in tiles.tile_configs("attn_fwd", cc, 128)) == offered, cc
    assert tiles.tile_configs("attn_bwd_dq", (7, 5), 128) != tiles.tile_configs("attn_bwd_dq", (8, 0), 128)
    assert tiles.shared_memory_per_block((13, 0)) == 99 * KiB
    assert tiles.tile_configs("attn_fwd", (13, 0), 128) == tiles.tile_configs("attn_fwd", (8, 6), 128)
    with pytest.raises(ValueError, match="sm_75 and newer"):
        tiles.tile_configs("attn_fwd", (7, 0), 64)
    with pytest.raises(ValueError, match="head dim 32"):
        tiles.tile_configs("attn_fwd", (8, 0), 32)
    with pytest.raises(ValueError, match="no kernel named"):
        tiles.tile_configs("attn_bwd", (8, 0), 64)
    with pytest.raises(ValueError, match=r"\(major, minor\)"):
        tiles.tile_configs("attn_fwd", 80, 64)
