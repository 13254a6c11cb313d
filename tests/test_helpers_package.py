"""The library's house rules: its folders are its layers (core -> measure -> data -> model -> train -> plan),
imports run one way through them, the library never imports the course (`course`), private names stay home,
and docs/architecture.md draws the folders as they are."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import course
import helpers

HELPERS = Path(helpers.__file__).resolve().parent
COURSE = Path(course.__file__).resolve().parent
ROOT = HELPERS.parent


def layer_modules() -> dict[str, list[str]]:
    """layer folder -> the modules in it (a subpackage counts as one module), as they are on disk."""
    return {layer.name: sorted({p.stem for p in layer.glob("*.py") if p.stem != "__init__"}
                               | {p.name for p in layer.iterdir() if (p / "__init__.py").is_file()})
            for layer in sorted(HELPERS.iterdir()) if (layer / "__init__.py").is_file()}


MODULES = [f"{layer}.{m}" for layer, ms in layer_modules().items() for m in ms]


def imported_modules(source: str) -> set[str]:
    """Every dotted module a source imports, anywhere in it (module level, inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def violations(layer: str, source: str) -> set[str]:
    """What a module of `layer` imports against the rules: the course, or a helpers layer above its own."""
    bad = set()
    for name in imported_modules(source):
        parts = name.split(".")
        if parts[0] == "course":
            bad.add(name)
        elif parts[0] == "helpers" and len(parts) > 1 and parts[1] in helpers.LAYERS:
            if helpers.LAYERS.index(parts[1]) > helpers.LAYERS.index(layer):
                bad.add(name)
    return bad


def _sources(dotted: str) -> list[Path]:
    path = HELPERS / dotted.replace(".", "/")
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def test_the_layers_are_the_folders():
    assert tuple(layer_modules()) == tuple(sorted(helpers.LAYERS)), "helpers.LAYERS must name every folder"
    assert [p.name for p in HELPERS.glob("*.py")] == ["__init__.py"], "every module lives in a layer's folder"
    for dotted in MODULES:  # absolute imports only, so the layer check below sees every import
        for path in _sources(dotted):
            assert not any(isinstance(n, ast.ImportFrom) and n.level
                           for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))), path
        importlib.import_module(f"helpers.{dotted}")


@pytest.mark.parametrize("dotted", MODULES)
def test_imports_run_one_way_and_never_into_the_course(dotted):
    layer = dotted.split(".")[0]
    found = set()
    for path in _sources(dotted):
        found |= violations(layer, path.read_text(encoding="utf-8"))
    assert not found, (f"helpers.{dotted} imports {sorted(found)}: the library imports its own layer and the "
                       f"ones below ({' -> '.join(helpers.LAYERS)}), never the course")


def test_the_check_catches_a_planted_upward_import_and_a_course_import():
    planted = "import torch\n\ndef f():\n    from helpers.train.loop import train\n    import course.plots\n"
    assert violations("core", planted) == {"helpers.train.loop", "helpers.train.loop.train", "course.plots"}
    assert violations("plan", planted) == {"course.plots"}  # plan may import train, nobody the course
    assert violations("measure", "from helpers.core.timing import benchmark\n") == set()
    assert violations("measure", "from helpers import model\n") == {"helpers.model"}
    assert violations("measure", "from helpers.model import models\n") == {"helpers.model",
                                                                           "helpers.model.models"}


def test_the_library_works_without_the_course_folder(tmp_path):
    """Every library module imports in a process where `course` cannot be imported at all."""
    import subprocess
    import sys

    code = ("import importlib, sys\n"
            "class NoCourse:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'course' or name.startswith('course.'):\n"
            "            raise ImportError('the course folder is absent')\n"
            "sys.meta_path.insert(0, NoCourse())\n"
            f"for m in {MODULES!r}:\n"
            "    importlib.import_module('helpers.' + m)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


# --- private names stay inside the module (or package) that defines them ---------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(dotted: str) -> str:
    """The module or package that owns a dotted name: everything before its first private part."""
    parts = dotted.split(".")
    first = next(i for i, p in enumerate(parts) if _is_private(p))
    return ".".join(parts[:first])


def private_imports(importer: str, source: str) -> set[str]:
    """Private helpers names (`_x`, as a module or an imported name) that `importer` imports from another
    module; a package's own modules may import its private modules (helpers.model.kernels -> ._triton_fwd)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for dotted in names:
            parts = dotted.split(".")
            if parts[0] not in ("helpers", "course") or not any(_is_private(p) for p in parts):
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
    for path in sorted([*HELPERS.rglob("*.py"), *COURSE.rglob("*.py")]):
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
    planted = "def f():\n    from helpers.model.attention import _check_qkv\n    return _check_qkv\n"
    kernel = "helpers.model.kernels.flash_attention"
    assert private_imports(kernel, planted) == {"helpers.model.attention._check_qkv"}
    nb = "notebooks/01_attention.ipynb"
    assert private_imports(nb, "from helpers.model.kernels import _triton_fwd\n") == {
        "helpers.model.kernels._triton_fwd"}
    assert private_imports("benchmarks/x.py", "import helpers.model.kernels._triton_bwd as b\n") == {
        "helpers.model.kernels._triton_bwd"}
    # allowed: a package's own modules use its private modules, a module its own private names
    own = "from helpers.model.kernels import _triton_fwd\n"
    assert private_imports("helpers.model.kernels.flash_attention", own) == set()
    own_name = "from helpers.model.attention import _causal_allowed\n"
    assert private_imports("helpers.model.attention", own_name) == set()
    public = "from helpers.model.attention import check_padding_mask\n"
    assert private_imports("scripts/x.py", public) == set()


# --- docs/architecture.md: the map of the house -----------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def drawn_tree(text: str) -> dict[str, set[str]]:
    """folder -> the modules the page's first drawing puts in it ("helpers/core", "course/lessons", ...)."""
    tree: dict[str, set[str]] = {}
    top = ""
    for line in text.split("```")[1].splitlines():
        m = re.match(r"^(\s*)([\w]+)/\s*(.*)$", line)
        if not m:
            continue
        indent, folder, rest = m.groups()
        if not indent:
            top = folder
            continue
        modules = re.split(r"\s{3,}", rest)[0]  # the modules, then (after 3+ spaces) what they are for
        tree[f"{top}/{folder}"] = set(modules.replace(",", " ").split())
    return tree


def tree_on_disk() -> dict[str, set[str]]:
    tree = {f"helpers/{layer}": set(ms) for layer, ms in layer_modules().items()}
    tree["course"] = {p.stem for p in COURSE.glob("*.py") if p.stem != "__init__"}
    for sub in sorted(COURSE.iterdir()):
        if sub.is_dir() and sub.name != "__pycache__":
            tree[f"course/{sub.name}"] = set()
    return tree


def architecture_problems(text: str) -> list[str]:
    drawn, disk = drawn_tree(text), tree_on_disk()
    disk_top = {k: v for k, v in disk.items() if k != "course"}
    problems = [f"{folder} is not drawn" for folder in disk_top if folder not in drawn]
    problems += [f"{folder} is drawn but not on disk" for folder in drawn
                 if folder not in disk and folder != "course/modules"]
    for folder, modules in disk_top.items():
        if folder in drawn and folder.startswith("helpers/") and drawn[folder] != modules:
            problems.append(f"{folder}: drawn {sorted(drawn[folder])}, on disk {sorted(modules)}")
    course_drawn = drawn.get("course/modules", set())
    if course_drawn != disk["course"]:
        problems.append(f"course/modules: drawn {sorted(course_drawn)}, on disk {sorted(disk['course'])}")
    return problems


def test_architecture_page_draws_the_folders_as_they_are_and_the_readme_links_it():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert not architecture_problems(text), architecture_problems(text)
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_architecture_check_catches_a_planted_omission_and_a_moved_module():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    moved = text.replace("tables timing", "tables", 1)
    assert any(p.startswith("helpers/core: drawn") for p in architecture_problems(moved))
    assert architecture_problems(text.replace("  plan/", "  planning/", 1)) == [
        "helpers/plan is not drawn", "helpers/planning is drawn but not on disk"]


# --- no import circle -----------------------------------------------------------------------------------

def import_graph() -> dict[str, set[str]]:
    """Library module -> the library modules it imports, at the top or inside functions."""
    graph: dict[str, set[str]] = {}
    for path in sorted(HELPERS.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for name in imported_modules(path.read_text(encoding="utf-8")):
            while name and name.startswith("helpers."):  # `from helpers.a.b import c`: c or the module a.b
                if (ROOT / (name.replace(".", "/") + ".py")).is_file():
                    found.add(name)
                    break
                name = name.rpartition(".")[0]
        graph[module] = found - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each once, as the modules around it."""
    found, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                circle = path[path.index(nxt):]
                key = frozenset(circle)
                if key not in seen:
                    seen.add(key)
                    found.append(circle + [nxt])
            elif len(path) < 12:
                walk(nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_the_library_has_no_import_circle():
    assert not cycles(import_graph()), cycles(import_graph())


def test_the_circle_check_finds_a_planted_circle():
    graph = import_graph()
    assert "helpers.model.attention" in graph["helpers.model.models"]  # models uses the naive attention
    graph["helpers.model.attention"] = graph["helpers.model.attention"] | {"helpers.model.models"}
    assert any({"helpers.model.attention", "helpers.model.models"} <= set(c) for c in cycles(graph))


# --- imports at the top, or a comment says why not ------------------------------------------------------

def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    names = {n.id for h in handlers if h.type for n in ast.walk(h.type) if isinstance(n, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def unexplained_imports(source: str) -> list[str]:
    """Imports inside a function that nothing explains: no comment on the import's line or the line above, no
    module-level comment that says "inside" and names the module (or a package above it, not bare `torch`),
    and no `except ImportError` around it (an optional module says so itself)."""
    lines = source.splitlines()
    blocks, block = [], []
    for line in lines + [""]:  # module-level comments, a block of consecutive "# " lines each
        if line.startswith("#"):
            block.append(line.lstrip("# "))
        elif block:
            blocks.append(" ".join(block))
            block = []
    reasons = [b for b in blocks if "inside" in b.lower()]
    found = []

    def visit(node: ast.AST, in_function: bool, optional: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function and not optional:
                module = child.module if isinstance(child, ast.ImportFrom) else child.names[0].name
                from_ = isinstance(child, ast.ImportFrom)
                dotted = [f"{module}.{a.name}" for a in child.names] if from_ else []
                names = {".".join(d.split(".")[:i]) for d in [module or "", *dotted]
                         for i in range(1, d.count(".") + 2)} - {"torch", "helpers"}
                beside = "#" in lines[child.lineno - 1] or lines[child.lineno - 2].strip().startswith("#")
                named = any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", r) for n in names for r in reasons)
                if not (beside or named):
                    found.append(f"line {child.lineno}: {module}")
            guarded = optional or (isinstance(child, ast.Try) and _catches_import_error(child.handlers))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), guarded)

    visit(ast.parse(source), False, False)
    return found


def test_imports_inside_functions_say_why():
    """Imports sit at the top of a module unless a comment names the cycle or the measured cost that keeps
    one inside a function (or the import is optional, under `except ImportError`)."""
    found = {str(p.relative_to(ROOT)): unexplained_imports(p.read_text(encoding="utf-8"))
             for p in sorted(HELPERS.rglob("*.py"))}
    found = {path: lines for path, lines in found.items() if lines}
    assert not found, f"imports inside functions with no comment saying why (move them to the top?): {found}"


def test_the_import_check_catches_a_planted_unexplained_import():
    planted = "import torch\n\n\ndef f():\n    from transformers import AutoModel\n    return AutoModel\n"
    assert unexplained_imports(planted) == ["line 5: transformers"]
    why = "# transformers is imported inside the functions that use it: 3 s to import (measured)\n"
    assert unexplained_imports(why + planted) == []
    assert unexplained_imports("# transformers costs 3 s\n" + planted) != []  # says nothing of "inside"
    beside = planted.replace("AutoModel\n    return", "AutoModel  # 3 s to import\n    return")
    assert unexplained_imports(beside) == []
    torch_only = "# torch is imported inside f\n" + planted.replace("transformers", "torch.distributed")
    assert unexplained_imports(torch_only) == ["line 6: torch.distributed"]  # bare `torch` names nothing
    optional = "def f():\n    try:\n        import torchao\n    except ImportError:\n        return None\n"
    assert unexplained_imports(optional) == []
    assert unexplained_imports("import os\n\n\ndef f():\n    return os.sep\n") == []


# --- the tests' own modules stay in tests/ --------------------------------------------------------------

TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")}


def reaches_into_tests(source: str) -> set[str]:
    """What a source outside tests/ takes from tests/: a tests module imported, or tests/ put on sys.path."""
    found = {name.split(".")[0] for name in imported_modules(source)} & TEST_MODULES
    if re.search(r"sys\.path.*[\"']tests[\"']", source):
        found.add("sys.path gets tests/")
    return found


def test_nothing_outside_tests_imports_the_tests():
    """The library, the course, the scripts, the benchmarks and the notebooks run without tests/: a tool
    built on the tests' fixtures (the fake GPUs, the wrong answers) lives in tests/ beside them."""
    sources = _importers() | {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
                              for p in sorted((ROOT / "site").rglob("*.py"))}
    found = {who: sorted(what) for who, src in sources.items() if (what := reaches_into_tests(src))}
    assert not found, f"these reach into tests/ (move the tool into tests/, or the code out of it): {found}"


def test_the_tests_check_catches_a_planted_reach():
    assert reaches_into_tests("from fakegpu import fake_gpu\n") == {"fakegpu"}
    planted = "import sys\nsys.path.insert(0, str(ROOT / 'tests'))\n"
    assert reaches_into_tests(planted) == {"sys.path gets tests/"}
    assert reaches_into_tests("from helpers.core.timing import benchmark\n") == set()


# --- file heads that tell the truth: docstrings short, the long prose in docs/library/ ------------------

def docstring_lines(source: str) -> int:
    """Lines of a source's docstrings: the module's, each class's and each function's."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                count += first.end_lineno - first.lineno + 1
    return count


def test_docstrings_are_at_most_a_tenth_of_the_library():
    """One-line docstrings naming the lesson; the guides are docs/library/<layer>.md (nanoGPT: 5-6 %)."""
    sources = [p.read_text(encoding="utf-8") for p in sorted(HELPERS.rglob("*.py"))]
    share = sum(map(docstring_lines, sources)) / sum(len(s.splitlines()) for s in sources)
    assert share <= 0.10, f"docstrings are {share:.1%} of the library's lines: move prose to docs/library/"


def test_the_docstring_count_counts_a_planted_docstring():
    planted = 'def f():\n    """One line.\n\n    And a long story.\n    """\n    return 1\n'
    assert docstring_lines(planted) == 4
    assert docstring_lines('"""Module."""\n\n\nclass A:\n    x = "not a docstring"\n') == 1
