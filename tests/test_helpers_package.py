"""The helpers package itself: every module listed, importable, in the docstring's table, and imports that
run one way through the layers (base -> measure -> model/data -> train -> show), for every module."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import helpers

HELPERS = Path(helpers.__file__).resolve().parent
ON_DISK = sorted({p.stem for p in HELPERS.glob("*.py") if p.stem != "__init__"}
                 | {p.name for p in HELPERS.iterdir() if (p / "__init__.py").is_file()})
# Known violations, left while their owner fixes them: (importer, imported). Empty: none known.
EXPECTED_VIOLATIONS: set[tuple[str, str]] = set()


def helpers_imports(source: str) -> set[str]:
    """The helpers modules a source imports, anywhere in it (module level, inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "helpers":
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("helpers."))
    return found


def violations(module: str, source: str) -> set[tuple[str, str]]:
    """(module, imported) pairs where `module` imports a module of a later layer, or one with no layer."""
    bad = set()
    for target in helpers_imports(source) - {module, "__init__"}:
        if target not in helpers.LAYERS or helpers.LAYERS[target] > helpers.LAYERS[module]:
            bad.add((module, target))
    return bad


def _sources(module: str) -> list[Path]:
    folder = HELPERS / module
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [HELPERS / f"{module}.py"]


def test_every_module_is_listed_importable_and_in_the_table():
    assert sorted(helpers._SUBMODULES) == ON_DISK, "helpers/__init__.py's LAYERS must list every module"
    table = {m.group(1) for m in re.finditer(r"^\| \w[\w/]* \| `(\w+)` \|", helpers.__doc__, flags=re.M)}
    assert table == set(ON_DISK), f"the docstring table lacks {set(ON_DISK) - table}"
    for name in ON_DISK:  # absolute imports only, so the layer check below sees every import
        assert not any(isinstance(n, ast.ImportFrom) and n.level for p in _sources(name)
                       for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))
        assert importlib.import_module(f"helpers.{name}") is getattr(helpers, name)
        assert name in dir(helpers)


@pytest.mark.parametrize("module", ON_DISK)
def test_imports_run_one_way(module):
    found = set()
    for path in _sources(module):
        found |= violations(module, path.read_text(encoding="utf-8"))
    unexpected = found - EXPECTED_VIOLATIONS
    assert not unexpected, (f"helpers.{module} imports {sorted(t for _, t in unexpected)} of a later layer "
                            f"(layers: {helpers.LAYERS}); imports run base -> measure -> model/data -> "
                            "train -> show")


def test_the_check_catches_a_planted_lazy_import():
    planted = "import torch\n\ndef f():\n    from helpers.train import train\n    import helpers.plots\n"
    assert violations("device", planted) == {("device", "train"), ("device", "plots")}
    assert violations("plots", planted) == set()  # show may import train
    assert violations("flops", "from helpers.roofline import peak_flops\n") == set()
    assert violations("flops", "from helpers import models\n") == {("flops", "models")}


def test_the_table_names_entry_points_that_exist():
    """Each `name` in the docstring table's last column is defined by that module, and documented with the
    lesson that teaches it (a renamed function fails here, not in a learner's notebook)."""
    rows = re.findall(r"^\| \w[\w/]* \| `(\w+)` \| [^|]+ \| (.+) \|$", helpers.__doc__, flags=re.M)
    assert len(rows) == len(ON_DISK)
    for module, names in rows:
        mod = importlib.import_module(f"helpers.{module}")
        for name in re.findall(r"`(\w+)`", names):
            assert hasattr(mod, name), f"helpers.{module} has no {name} (the table in helpers/__init__.py)"
            obj = getattr(mod, name)
            if callable(obj) and getattr(obj, "__module__", "").startswith("helpers"):
                assert obj.__doc__ and re.search(r"lesson|benchmark|script", obj.__doc__, flags=re.I), (
                    f"helpers.{module}.{name}'s docstring should name the lesson that uses it")


# --- private names stay inside the module (or package) that defines them ---------------------------------

ROOT = HELPERS.parent


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(dotted: str) -> str:
    """The module or package that owns a dotted name: everything before its first private part."""
    parts = dotted.split(".")
    first = next(i for i, p in enumerate(parts) if _is_private(p))
    return ".".join(parts[:first])


def private_imports(importer: str, source: str) -> set[str]:
    """Private helpers names (`_x`, as a module or an imported name) that `importer` imports from another
    module; a package's own modules may import its private modules (helpers.kernels -> ._triton_fwd)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for dotted in names:
            if dotted.split(".")[0] != "helpers" or not any(_is_private(p) for p in dotted.split(".")):
                continue
            owner = _owner(dotted)
            inside = importer == owner or importer.startswith(owner + ".")
            # a package owns its private modules; a plain module keeps its private names to itself
            if not (inside and (HELPERS.parent / owner.replace(".", "/")).is_dir()) and importer != owner:
                found.add(dotted)
    return found


def _importers() -> dict[str, str]:
    """Every source the rule covers: helpers modules, scripts, benchmarks and notebook code cells."""
    import nbformat

    sources = {}
    for path in sorted(HELPERS.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        sources[module.removesuffix(".__init__")] = path.read_text(encoding="utf-8")
    for folder in ("scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            sources[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        code = [c.source for c in cells if c.cell_type == "code"]
        # IPython magics and shell escapes are not Python: a `pass` at their indentation before parsing
        lines = [ln if not ln.lstrip().startswith(("%", "!")) else ln[:len(ln) - len(ln.lstrip())] + "pass"
                 for ln in "\n".join(code).splitlines()]
        sources[str(path.relative_to(ROOT))] = "\n".join(lines)
    return sources


def test_no_private_name_is_imported_across_modules():
    """Helpers modules, scripts, benchmarks and notebooks import only public names of other modules (issue
    19): a private name (`_x`) can change without notice, so whoever needs it gets a public one instead."""
    found = {who: sorted(private_imports(who, src)) for who, src in _importers().items()}
    found = {who: names for who, names in found.items() if names}
    assert not found, f"private names imported across modules (make them public or keep them inside): {found}"


def test_the_private_import_check_catches_planted_imports():
    planted = "def f():\n    from helpers.attention import _check_qkv\n    return _check_qkv\n"
    assert private_imports("helpers.kernels.flash_attention", planted) == {"helpers.attention._check_qkv"}
    assert private_imports("notebooks/01_attention.ipynb", "from helpers.kernels import _triton_fwd\n") == {
        "helpers.kernels._triton_fwd"}
    assert private_imports("benchmarks/x.py", "import helpers.kernels._triton_bwd as b\n") == {
        "helpers.kernels._triton_bwd"}
    # allowed: a package's own modules use its private modules, a module its own private names
    own = "from helpers.kernels import _triton_fwd\n"
    assert private_imports("helpers.kernels.flash_attention", own) == set()
    assert private_imports("helpers.attention", "from helpers.attention import _causal_allowed\n") == set()
    assert private_imports("scripts/x.py", "from helpers.attention import check_padding_mask\n") == set()


# --- docs/architecture.md: the map of the package ---------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYER_NAMES = ("base", "measure", "model/data", "train", "show")


def architecture_rows(text: str) -> dict[str, str]:
    """module -> layer name, from the table of docs/architecture.md."""
    rows = re.finditer(r"^\| ([\w/]+) \| `(\w+)` \| .+ \|$", text, flags=re.M)
    return {m.group(2): m.group(1) for m in rows}


def architecture_problems(text: str) -> list[str]:
    """Modules missing from the page, listed but not on disk, or placed in another layer than LAYERS'."""
    rows = architecture_rows(text)
    problems = [f"{m} is missing" for m in ON_DISK if m not in rows]
    problems += [f"{m} is not a helpers module" for m in rows if m not in helpers.LAYERS]
    for m, layer in rows.items():
        if m in helpers.LAYERS and layer != LAYER_NAMES[helpers.LAYERS[m]]:
            problems.append(f"{m} is in layer {layer!r}, LAYERS says {LAYER_NAMES[helpers.LAYERS[m]]!r}")
    return problems


def drawing_problems(text: str) -> list[str]:
    """Modules of the table that the layer drawing does not put on their layer's lines."""
    drawn: dict[str, str] = {}  # layer -> the module names the drawing puts on its lines
    layer = ""
    for line in text.split("```")[1].splitlines():
        cells = re.split(r"\s{3,}", line.strip())  # layer, modules, what they are for; or modules alone
        if cells[0] in LAYER_NAMES:
            layer, cells = cells[0], cells[1:]
        drawn[layer] = drawn.get(layer, "") + " " + cells[0]
    return [f"the drawing lacks {module} under {layer}" for module, layer in architecture_rows(text).items()
            if not re.search(rf"\b{module}\b", drawn.get(layer, ""))]


def test_architecture_page_lists_every_module_in_its_layer_and_the_readme_links_it():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert not architecture_problems(text) and not drawing_problems(text), (
        architecture_problems(text) + drawing_problems(text))
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_architecture_check_catches_a_planted_omission_and_a_wrong_layer():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert architecture_problems(text.replace("| base | `device` |", "| base | `devices` |")) == [
        "device is missing", "devices is not a helpers module"]
    assert architecture_problems(text.replace("| measure | `flops` |", "| train | `flops` |")) == [
        "flops is in layer 'train', LAYERS says 'measure'"]
    assert drawing_problems(text.replace("device, diagnosis", "device")) == [
        "the drawing lacks diagnosis under base"]
