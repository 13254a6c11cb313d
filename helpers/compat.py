"""The one place where the course meets APIs that differ between the versions it supports (all lessons).

Every version-dependent call goes through a function here; when the installed version cannot do a thing,
the function raises a clear error naming the version needed. Supported range: see pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata

from torch import nn

__all__ = ["version_of", "at_least", "require", "set_attn_implementation"]


def _as_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def version_of(package: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed (all lessons)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def at_least(package: str, minimum: str) -> bool:
    """True when `package` is installed at `minimum` or newer (all lessons)."""
    found = version_of(package)
    return found is not None and _as_tuple(found) >= _as_tuple(minimum)


def require(package: str, minimum: str, what: str) -> None:
    """Raise RuntimeError naming `what`, the version needed and the one installed (all lessons)."""
    if not at_least(package, minimum):
        raise RuntimeError(f"{what} needs {package} >= {minimum}; this environment has "
                           f"{package} {version_of(package) or 'not installed'}: "
                           f"pip install '{package}>={minimum}'")


def set_attn_implementation(model: nn.Module, impl: str) -> nn.Module:
    """Switch a Hugging Face model's attention implementation ('eager', 'sdpa', ...) (lessons 01, 07).

    Returns the model to use from now on (the same object where the installed transformers can switch in
    place)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
        return model
    raise RuntimeError(f"switching attention to {impl!r} after loading needs transformers >= 4.54; this "
                       f"environment has transformers {version_of('transformers')}")
