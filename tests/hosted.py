"""A simulated hosted notebook (Colab, Kaggle), for tests/test_hosted.py: a fresh Python with a torch already
installed, Colab's ipywidgets major version, no `make`, no course.

    python = make_host(tmp / "host")             # a venv: what Colab ships linked, ipywidgets 7 installed
    archive = course_archive(tmp / "course.zip")  # the working tree as GitHub's zip of a release
    nb = hosted_copy(lesson, archive)             # the lesson, its install cell pointed at that zip
    run_notebook(nb, python, cwd=tmp / "content", env={...})

What the host "ships" is reached, not reinstalled: the venv has a path file (`host.pth`) naming a folder of
links to the distributions of torch, ipykernel and pip in the interpreter running the tests, and nothing else
(helpers and every other dependency of the course must come from the lesson's set-up cell). That keeps a host
to seconds instead of torch's wheel. ipywidgets 7.7.1, Colab's, is pip-installed into the venv.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["HOST_SHIPS", "IPYWIDGETS", "REPO_ROOT", "cpu_runtime", "host_links", "make_host", "course_source",
           "course_archive", "release", "hosted_copy", "run_notebook"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# What Colab's CPU runtime ships before the course (with their dependencies): torch, numpy, transformers,
# scikit-learn, matplotlib, tqdm, a Jupyter server with its kernel, pip; no triton (a GPU runtime's CUDA torch
# brings its own; on a CPU runtime only lesson 01's cell installs it). The set-up cell installs the rest: the
# course, its offline MiniLM and corpus packages.
HOST_SHIPS = ("torch", "numpy", "transformers", "scikit-learn", "matplotlib", "tqdm", "ipykernel",
              "jupyterlab", "pip")
IPYWIDGETS = "ipywidgets==7.7.1"  # what Colab ships: the floor the course's widgets are tested on


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions `names` need, their dependencies included (markers of this machine)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency this machine lacks
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def cpu_runtime() -> bool:
    """Whether the host is Colab's CPU runtime (no triton): so when the torch it ships is a CPU build.
    PyPI's CUDA build (the matrix sets: `make test-matrix`) requires triton and brings it, as on Colab's GPU
    runtime."""
    reqs = [Requirement(r) for r in metadata.requires("torch") or []]
    return not any(r.name == "triton" and (r.marker is None or r.marker.evaluate({"extra": ""}))
                   for r in reqs)


def host_links(folder: Path, names: tuple[str, ...] = HOST_SHIPS) -> int:
    """Fill `folder` with links to the files of `names` and their dependencies -> distributions linked."""
    folder.mkdir(parents=True, exist_ok=True)
    dists = _closure(names)
    for dist in dists:
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            target, link = base / top, folder / top
            if target.exists() and not link.exists() and top not in ("__pycache__", "bin"):
                link.symlink_to(target, target_is_directory=target.is_dir())
    return len(dists)


def _run(cmd: list[str], **kw) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def make_host(folder: Path, ipywidgets: str = IPYWIDGETS) -> tuple[Path, dict[str, float]]:
    """A venv in `folder`: HOST_SHIPS linked, `ipywidgets` installed -> (its python, seconds)."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    _run([str(base if base.exists() else sys.executable), "-m", "venv", "--without-pip", str(folder)])
    python = folder / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(_run([str(python), "-c", where]).strip())
    n = host_links(folder / "host-site")
    (purelib / "host.pth").write_text(str(folder / "host-site") + "\n")
    seconds["venv + links"] = time.perf_counter() - start
    start = time.perf_counter()
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", ipywidgets])
    seconds["ipywidgets"] = time.perf_counter() - start
    # the host must not have the course: its set-up cell is what is tested
    code = ("import importlib.util as u; from importlib.metadata import version as v; print("
            "u.find_spec('helpers') is None, v('ipywidgets'), v('torch'), u.find_spec('triton') is None)")
    probe = _run([str(python), "-c", code], cwd=folder).split()
    if probe[0] != "True" or not probe[1].startswith("7.") or (probe[3] != "True" and cpu_runtime()):
        raise RuntimeError(f"the simulated host is wrong: helpers absent={probe[0]}, ipywidgets {probe[1]}, "
                           f"triton absent={probe[3]}")
    seconds["distributions linked"] = n
    return python, seconds


def release(root: Path = REPO_ROOT) -> str:
    """pyproject.toml's release: the ref the set-up cell clones."""
    import tomllib

    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["course"]["release"]


def _tree(root: Path) -> list[str]:
    """The working tree's files: tracked and new, unignored, as they are now."""
    listed = _run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    return [rel for rel in sorted(set(filter(None, listed.split("\0")))) if (root / rel).is_file()]


def course_source(folder: Path, root: Path = REPO_ROOT) -> str:
    """The working tree's course as a git repository in `folder` whose branch named by the release holds it
    -> its file:// URL (tests/test_learner_copy.py clones it as a learner clones the course)."""
    import shutil

    folder.mkdir(parents=True)
    for rel in _tree(root):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, folder / rel)
    git = ["git", "-C", str(folder), "-c", "user.name=test", "-c", "user.email=test@localhost"]
    _run(git[:3] + ["init", "--quiet", "--initial-branch", release(root)])
    _run(git + ["add", "-A"])
    _run(git + ["commit", "--quiet", "-m", "the course as tested"])
    return folder.resolve().as_uri()


def course_archive(path: Path, root: Path = REPO_ROOT) -> str:
    """The working tree's course (tracked and new, unignored files, as they are now) as GitHub's zip of a
    release (one top folder) at `path` -> its file:// URL, which the install cell's pip installs."""
    import zipfile

    top = f"fast-transformers-course-{release(root)}"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in _tree(root):
            zf.write(root / rel, f"{top}/{rel}")
    return path.resolve().as_uri()


def hosted_copy(lesson: str, archive: str, root: Path = REPO_ROOT):
    """`lesson` as the learner opens it, its install cell pointed at `archive` instead of GitHub's zip of the
    release (the one line that differs from what Colab runs)."""
    import nbformat

    spec = importlib.util.spec_from_file_location("course_release", root / "scripts" / "course_release.py")
    course_release = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course_release)
    url = course_release.archive_url(course_release.release_info(root))
    nb = nbformat.read(root / "notebooks" / f"{lesson}.ipynb", as_version=4)
    boot = next(c for c in nb.cells if c.cell_type == "code")
    if url not in boot.source:
        raise AssertionError(f"{lesson}: its install cell does not install {url}")
    boot.source = boot.source.replace(url, archive)
    return nb


def run_notebook(nb, python: Path, cwd: Path, env: dict[str, str | None], timeout_s: int = 900) -> object:
    """Execute the notebook node `nb` in a kernel of `python`, in `cwd`, with this process's environment
    updated by `env` (a None value removes the variable) -> the executed node.
    A cell that raises stops the run (nbclient's CellExecutionError), as nbval's lax mode fails it."""
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    from course.nbrun import CourseKernelManager  # as make course and make site run notebooks

    specs = cwd.parent / "kernels"
    (specs / "hosted").mkdir(parents=True, exist_ok=True)
    (specs / "hosted" / "kernel.json").write_text(
        '{"argv": ["%s", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "hosted", '
        '"language": "python"}' % python)
    km = CourseKernelManager(kernel_name="hosted",
                             kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
    kernel_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    kernel_env.update(env)
    kernel_env = {k: v for k, v in kernel_env.items() if v is not None}
    client = NotebookClient(nb, km=km, timeout=timeout_s, resources={"metadata": {"path": str(cwd)}})
    return client.execute(env=kernel_env, cwd=str(cwd))
