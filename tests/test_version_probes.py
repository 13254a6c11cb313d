"""Every version-dependent call goes through helpers/core/compat.py (issue 25): a source test over helpers/,
scripts/ and benchmarks/ that finds version probes and private torch reads anywhere else, with planted
offences proving that each kind is caught.

What counts as a probe (outside compat):
- reading an installed version: `importlib.metadata`, `packaging.version`, `pkg_resources`;
- comparing or parsing a `__version__` (printing one in a message is fine);
- asking whether torch / transformers / triton / torchao has an API: `hasattr(torch..., ...)`,
  `getattr(torch..., name, default)`, or `try: from torch... import ...` / `except ImportError`;
- reading a private attribute: of torch (`torch._x`, `torch.a._x`, `from torch... import _x`, `import
  torch._x`), or of any object the code did not define itself (`scaler._scale`, `getattr(m, "_orig_mod")`).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("helpers", "course", "scripts", "benchmarks")
HOME = "helpers/core/compat.py"
LIBRARIES = {"torch", "transformers", "triton", "torchao"}
# Private attributes the course sets on objects of other libraries itself, with the reason.
OWN_PRIVATE = {
    "_course_handler",  # helpers.train.distributed marks the logging handler it adds, to add it once
}
# Files with known probes, left while their owner moves them into compat: file -> what is left. Each entry
# must still find an offence (a stale entry fails), so it goes away when the file is fixed.
PENDING: dict[str, str] = {}
# Files that may not import helpers.core.compat, with the reason (each must still find an offence, as
# PENDING's).
STDLIB_ONLY = {
    # the GPU check's wheel step runs on a bare box before torch may be importable: standard library only;
    # it asks whether packages are present (importlib.metadata), never compares versions
    "scripts/gpucheck/wheels.py": "presence checks of installed distributions before the wheels step",
}


def _root(node: ast.AST) -> str | None:
    """The name a dotted expression starts from (`torch` in torch.backends.mps.is_available), or None."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("_")  # not dunders, not IPython's _repr_*_


def _library_aliases(tree: ast.AST) -> set[str]:
    """Names bound to torch / transformers / triton / torchao (or their modules) by this source's imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] in LIBRARIES}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names |= {a.asname or a.name for a in node.names}
    return names


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """Dotted names an import statement reads: modules, and module.name for `from` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    module = node.module or ""
    return [module] + [f"{module}.{a.name}" for a in node.names]


def _import_probe(node: ast.Import | ast.ImportFrom) -> str | None:
    for dotted in _imported(node):
        if dotted.startswith(("importlib.metadata", "packaging.version", "pkg_resources")):
            return f"reads an installed version ({dotted})"
        parts = dotted.split(".")
        if parts[0] in LIBRARIES and any(_private(p) for p in parts):
            return f"imports a private name ({dotted})"
    return None


def _attribute_probe(node: ast.Attribute, parent: ast.AST | None) -> str | None:
    if node.attr == "metadata" and _root(node) == "importlib":
        return "reads an installed version (importlib.metadata)"
    parsed = isinstance(parent, (ast.Compare, ast.Attribute, ast.Subscript, ast.Call))  # not in a message
    if node.attr == "__version__" and parsed:
        return f"compares or parses {ast.unparse(node)}"
    if _private(node.attr) and node.attr not in OWN_PRIVATE and _root(node) not in ("self", "cls"):
        return f"reads a private attribute ({ast.unparse(node)})"
    return None


def _call_probe(node: ast.Call, libs: set[str]) -> str | None:
    if not (isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") and node.args):
        return None
    name, first = node.func.id, node.args[0]
    attr = node.args[1] if len(node.args) > 1 else None
    if isinstance(attr, ast.Constant) and isinstance(attr.value, str) and _private(attr.value) \
            and attr.value not in OWN_PRIVATE:
        return f"reads a private attribute ({ast.unparse(node)})"
    if (name == "hasattr" or len(node.args) == 3) and _root(first) in libs:
        return f"probes an API ({ast.unparse(node)})"
    return None


def _try_probe(node: ast.Try) -> str | None:
    catches = any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError")
                  for h in node.handlers
                  for k in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]))
    imports = any(dotted.split(".")[0] in LIBRARIES for stmt in node.body for n in ast.walk(stmt)
                  if isinstance(n, (ast.Import, ast.ImportFrom)) for dotted in _imported(n))
    return "probes an API by importing it (try / except ImportError)" if catches and imports else None


@functools.cache
def probes(source: str) -> tuple[str, ...]:
    """Version probes and private reads in `source`, as 'line: what' strings."""
    tree = ast.parse(source)
    libs = _library_aliases(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
               if isinstance(child, ast.Attribute) and child.attr == "__version__"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            what = _import_probe(node)
        elif isinstance(node, ast.Attribute):
            what = _attribute_probe(node, parents.get(node))
        elif isinstance(node, ast.Call):
            what = _call_probe(node, libs)
        elif isinstance(node, ast.Try):
            what = _try_probe(node)
        else:
            what = None
        if what:
            found.append(f"{node.lineno}: {what}")
    return tuple(found)


def _sources() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
            for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def offenders(sources: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """path -> its probes, for every source but compat and the pending files."""
    found = {path: probes(src) for path, src in sources.items() if path != HOME and path not in PENDING
             and path not in STDLIB_ONLY}
    return {path: hits for path, hits in found.items() if hits}


def test_version_probes_and_private_reads_live_in_compat_only():
    found = offenders(_sources())
    assert not found, f"version-dependent code outside {HOME} (add a function there and call it): {found}"


def test_a_probe_planted_in_a_real_module_fails_the_check():
    sources = _sources()
    assert "helpers/train/loop.py" in sources and not offenders(sources)
    sources["helpers/train/loop.py"] += "\n\ndef _scale(scaler):\n    return scaler._scale\n"
    sources["scripts/x.py"] = "import torch\nNEW = torch.__version__ >= '2.9'\n"
    assert set(offenders(sources)) == {"helpers/train/loop.py", "scripts/x.py"}
    sources[HOME] += "\nimport importlib.metadata\n"  # compat itself may
    assert set(offenders(sources)) == {"helpers/train/loop.py", "scripts/x.py"}


@pytest.mark.parametrize("path", sorted({**PENDING, **STDLIB_ONLY}))
def test_pending_files_still_have_their_probe(path):
    assert probes((ROOT / path).read_text(encoding="utf-8")), (
        f"{path} has no version probe left: remove it from PENDING in {Path(__file__).name}")


@pytest.mark.parametrize("planted", [
    "import importlib.metadata\nv = importlib.metadata.version('torch')\n",
    "from importlib.metadata import version\n",
    "import torch\nold = torch.__version__ < '2.9'\n",
    "import torch\nmajor = torch.__version__.split('.')[0]\n",
    "from packaging.version import Version\n",
    "import torch\nif hasattr(torch, '_scaled_mm'):\n    pass\n",
    "import torch\nfused = hasattr(torch.optim, 'AdamW')\n",
    "from torch import nn\nok = getattr(nn, 'RMSNorm', None)\n",
    "try:\n    from torch.nn.attention.varlen import varlen_attn\nexcept ImportError:\n    pass\n",
    "import torch\non = torch.autograd._profiler_enabled()\n",
    "def scale(scaler):\n    return scaler._scale\n",
    "def inner(model):\n    return getattr(model, '_orig_mod', model)\n",
    "from torch.cuda import _memory_viz\n",
    "import torch._dynamo\n",
])
def test_each_kind_of_probe_is_caught(planted):
    assert probes(planted), f"not caught: {planted!r}"


def test_what_is_not_a_probe():
    fine = ("import torch\nfrom helpers.core import compat\n"
            "print(f'torch {torch.__version__}')\n"  # a version in a message
            "stamp = {'torch': torch.__version__}\n"  # ... or a report
            "def f(self, model):\n    self._cache = hasattr(model, 'config')\n"  # own attribute; a model's
            "    return compat.version_of('triton'), compat.unwrap_model(model)\n"
            "class H:\n    _course_handler = True\n    def _repr_html_(self):\n        return ''\n")
    assert probes(fine) == ()
