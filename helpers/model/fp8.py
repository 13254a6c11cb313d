"""FP8 matmuls for a model's Linear layers: lesson 08's "+ FP8" rung, on GPUs of compute capability 8.9+.
torchao's float8 training when it is installed, else this module's `FP8Linear` on `torch._scaled_mm`.
Guide: docs/library/model.md#helpersmodelfp8"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core import compat

# torchao is optional (not a dependency): imported inside the functions that use it, so this module imports
# without it and `fp8_capable` says what is missing

__all__ = ["RECIPES", "BACKENDS", "E4M3", "E5M2", "FP8_CAPABILITY", "fp8_capable", "fp8_supported",
           "torchao_available", "quantize",
           "fp8_matmul", "FP8Linear", "default_skip", "convert_to_float8"]

RECIPES = ("tensorwise", "rowwise")
BACKENDS = ("auto", "torchao", "scaled_mm")
E4M3 = torch.float8_e4m3fn  # weights and activations
E5M2 = torch.float8_e5m2  # gradients (tensorwise recipe)
HEAD_NAMES = ("classifier", "head", "lm_head", "score")  # output layers kept in high precision


FP8_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def fp8_capable(device: torch.device | str) -> tuple[bool, str]:
    """(ok, why): FP8 tensor cores (compute capability >= 8.9), from the capability alone (lesson 08)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, f"FP8 tensor cores are a GPU feature (compute capability >= 8.9); this is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if (major, minor) < FP8_CAPABILITY:
        return False, f"{name} has compute capability {major}.{minor}; FP8 needs >= 8.9 (Ada, Hopper)"
    return True, f"{name} (compute capability {major}.{minor}) has FP8 tensor cores"


def fp8_supported(device: torch.device | str) -> tuple[bool, str]:
    """(ok, why): `fp8_capable`, and one tiny FP8 matmul of this torch runs on `device` (lesson 08)."""
    ok, why = fp8_capable(device)
    if not ok:
        return False, why
    ok, probe = compat.scaled_mm_supports(str(torch.device(device)), False)  # this torch's FP8 matmul, once
    return (True, why) if ok else (False, probe)


def torchao_available() -> bool:
    """Whether torchao (with its float8 training) is importable (lesson 08)."""
    return importlib.util.find_spec("torchao") is not None


def quantize(x: torch.Tensor, dtype: torch.dtype = E4M3, dim: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (x8, scale) with x ≈ x8.float() * scale; amax per tensor (dim=None) or along `dim` (lesson 08)."""
    if dtype not in (E4M3, E5M2):
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    fmax = torch.finfo(dtype).max  # 448 for e4m3, 57344 for e5m2
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = amax.float().clamp(min=1e-12) / fmax  # an all-zero tensor gets a tiny scale, not a 0/0
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype), scale


def _pad16(t: torch.Tensor) -> torch.Tensor:
    # _scaled_mm wants multiples of 16; zeros change neither amax nor the product
    rows, cols = (-t.shape[0]) % 16, (-t.shape[1]) % 16
    return F.pad(t, (0, cols, 0, rows)) if rows or cols else t


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, *, recipe: str = "tensorwise", a_dtype: torch.dtype = E4M3,
               b_dtype: torch.dtype = E4M3, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a (M, K) @ b (K, N) in FP8, scaled per tensor or per row of a / column of b (lesson 08)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need a (M, K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    m, n = a.shape[0], b.shape[1]
    rowwise = recipe == "rowwise"
    ok, why = compat.scaled_mm_supports(str(a.device), rowwise)  # one probe per device and recipe
    if not ok:
        raise RuntimeError(f"fp8_matmul with recipe={recipe!r} cannot run here: {why}. Row-wise scales on a "
                           "CPU need a newer torch (2.13 runs them; 2.11 does not): use recipe='tensorwise'")
    a8, sa = quantize(_pad16(a), a_dtype, dim=1 if rowwise else None)  # sa (M, 1) or ()
    b8, sb = quantize(_pad16(b), b_dtype, dim=0 if rowwise else None)  # sb (1, N) or ()
    b8 = b8.t().contiguous().t()  # column-major, as _scaled_mm's second operand must be
    mm_dtype = torch.bfloat16 if rowwise else out_dtype  # row-wise scaled kernels write bf16 only
    out = compat.scaled_mm(a8.contiguous(), b8, scale_a=sa, scale_b=sb, out_dtype=mm_dtype)
    return out[:m, :n].to(out_dtype)


class _FP8LinearFn(torch.autograd.Function):
    # y = x·Wᵀ: forward, and backward's grad_x = g·W and grad_W = gᵀ·x, all three in FP8
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, recipe: str,
                out_dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # x (M, K), weight (N, K)
        ctx.recipe = recipe
        return fp8_matmul(x, weight.t(), recipe=recipe, out_dtype=out_dtype)  # (M, N)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        x, weight = ctx.saved_tensors
        g_dtype = E5M2 if ctx.recipe == "tensorwise" else E4M3  # rowwise kernels take e4m3 only
        r = ctx.recipe
        grad_x = fp8_matmul(grad_y, weight, recipe=r, a_dtype=g_dtype, out_dtype=x.dtype)  # (M, K)
        grad_w = fp8_matmul(grad_y.t(), x, recipe=r, a_dtype=g_dtype, out_dtype=weight.dtype)  # (N, K)
        return grad_x, grad_w, None, None


class FP8Linear(nn.Linear):
    """nn.Linear whose matmuls run in FP8; output in the autocast dtype, else the input's (lesson 08)."""

    recipe: str = "tensorwise"

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str = "tensorwise") -> "FP8Linear":
        """The same parameters (shared, not copied) behind an FP8 matmul."""
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        new.weight, new.bias = linear.weight, linear.bias
        new.recipe = recipe
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        y = _FP8LinearFn.apply(x.reshape(-1, self.in_features), self.weight, self.recipe, out_dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)  # (..., N)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def _torchao_config(recipe: str) -> Any:
    from torchao.float8 import Float8LinearConfig

    # pad_inner_dim: grad_W = gᵀ·x has the token count as its inner dimension (BERT's pooler: the batch
    # size), which _scaled_mm wants a multiple of 16; torchao's recipes leave it off
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)


def default_skip(name: str, module: nn.Linear) -> bool:
    """Keep in high precision: the output head, and sizes not multiples of 16 (lesson 08)."""
    return name.split(".")[-1] in HEAD_NAMES or module.in_features % 16 != 0 or module.out_features % 16 != 0


def convert_to_float8(model: nn.Module, *, recipe: str = "tensorwise",
                      skip: Callable[[str, nn.Linear], bool] = default_skip,
                      backend: str = "auto") -> nn.Module:
    """Swap the model's nn.Linear layers (but those `skip` keeps) for FP8 ones in place; `model.course_fp8`
    says which backend and layers (lesson 08)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torchao" and not torchao_available():
        raise ValueError("backend='torchao' but torchao is not installed: pip install torchao, "
                         "or use backend='scaled_mm'")
    param = next(model.parameters(), None)
    if param is not None and param.device.type == "cuda":
        ok, why = fp8_supported(param.device)
        if not ok:
            raise ValueError(f"FP8 cannot run on this GPU: {why}")
    # plain nn.Linear only: a layer already in FP8 (ours or torchao's, both subclasses) is not wrapped twice
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and n]
    converted = [n for n, m in linears if not skip(n, m)]
    kept = [n for n, m in linears if skip(n, m)]
    if not converted:
        raise ValueError(f"no nn.Linear layer to convert in {type(model).__name__} (kept: {kept})")
    use = "torchao" if backend == "torchao" or (backend == "auto" and torchao_available()) else "scaled_mm"
    if use == "torchao":
        from torchao.float8 import convert_to_float8_training

        chosen = set(converted)
        convert_to_float8_training(model, config=_torchao_config(recipe),
                                   module_filter_fn=lambda mod, fqn: fqn in chosen)
    else:
        for name in converted:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, FP8Linear.from_linear(getattr(parent, child), recipe))
    model.course_fp8 = {"backend": use, "recipe": recipe, "converted": converted, "kept": kept}
    return model
