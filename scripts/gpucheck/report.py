"""What comes back from the box: the summary (summary.md, summary.json), every log and result folded into
results.tar.gz, at most MAX_FILES files in all; and publishing the benchmarks' results here."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from gpucheck import ROOT

__all__ = ["MAX_FILES", "MAX_FILE_BYTES", "MAX_DEPTH", "STAMP_KEYS", "summary_markdown", "read_stamp",
           "publish", "pack", "clear_out", "publish_from"]

MAX_FILES = 8  # files that may come back from the borrowed box, each at most MAX_FILE_BYTES,
MAX_FILE_BYTES = 16 * 2**20  # at most MAX_DEPTH folders down
MAX_DEPTH = 2
# what the summary shows of the `env` step's stamp (course.results.stamp: the course's one stamp)
STAMP_KEYS = ("device", "driver", "cuda", "torch", "transformers", "triton", "python", "date")


def summary_markdown(outcomes: list, stamp: dict, gaps: list[str] = ()) -> str:
    """The pass/fail table of a run, with the machine it ran on and the GPU paths it had to skip."""
    failed = [o.name for o in outcomes if o.status != "pass"]
    machine = " | ".join(f"{k}: {v}" for k, v in stamp.items())
    lines = ["# GPU check", "", f"| {machine} |" if stamp else "(no environment report)",
             "", f"**{len(outcomes) - len(failed)} of {len(outcomes)} steps passed**"
             + (f"; not passed: {', '.join(failed)}" if failed else ""), "",
             *([f"Gaps (GPU paths that skipped): {'; '.join(gaps)}", ""] if gaps else []),
             "| step | status | seconds | limit s | what | log |", "|---|---|---:|---:|---|---|"]
    lines += [f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.timeout_s} | {o.what} | {o.log} |"
              for o in outcomes]
    for o in outcomes:
        if o.status != "pass" and o.tail:
            lines += ["", f"## {o.name}: last lines", "", "```", *o.tail[-12:], "```"]
    return "\n".join(lines) + "\n"


def read_stamp(work: Path) -> dict:
    """The machine and versions the `env` step wrote (environment.json), or {} when it did not run."""
    path = work / "environment.json"
    if not path.exists():
        return {}
    stamp = json.loads(path.read_text()).get("stamp", {})
    return {k: stamp.get(k) for k in STAMP_KEYS}


def publish(passed: set[str], results: dict[str, str], dest: Path) -> list[Path]:
    """Copy the result files of every step that passed (`results`: step -> its folder) into `dest`."""
    copied = []
    for name, folder in results.items():
        if name in passed and Path(folder).is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(Path(folder).iterdir()):
                if f.is_file():
                    copied.append(Path(shutil.copy2(f, dest / f.name)))
    return copied


def pack(out: Path) -> list[Path]:
    """Fold out/work (logs, results, reports) into results.tar.gz; keep at most MAX_FILES files in `out`.

    Left beside the tarball: summary.md, summary.json and, while room is left, the benchmarks' Markdown
    tables, so the headline numbers can be read without unpacking.
    """
    work = out / "work"
    tarball = out / "results.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for f in sorted(work.rglob("*")):
            if f.is_file() and "cache" not in f.relative_to(work).parts[:1]:
                tar.add(f, arcname=f"gpu-check/{f.relative_to(work).as_posix()}")
        for name in ("summary.md", "summary.json"):
            if (out / name).exists():
                tar.add(out / name, arcname=f"gpu-check/{name}")
    room = MAX_FILES - 3
    tables = sorted((work / "results").rglob("*.md")) if (work / "results").is_dir() else []
    for f in tables[:room]:
        shutil.copy2(f, out / f.name)
    shutil.rmtree(work)
    kept = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(kept) <= MAX_FILES, f"{len(kept)} files in {out}: at most {MAX_FILES} come back"
    too_big = [p.name for p in kept if p.stat().st_size > MAX_FILE_BYTES]
    if too_big:
        print(f"WARNING: larger than {MAX_FILE_BYTES >> 20} MiB, will not come back: {too_big}")
    return kept


def clear_out(out: Path) -> None:
    """Empty the output folder for a new run (kept itself: on a borrowed box it may be a mount point).

    Only what a check leaves there is removed; a folder holding anything else is refused (ValueError).
    """
    ours = {"summary.md", "summary.json", "results.tar.gz", "work"}
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"GPU_CHECK_OUT={out} is a file: name a folder")
        names = {p.name for p in out.iterdir()}
        others = [n for n in names if n not in ours and not n.endswith(".md")]
        if others or (names and not names & {"summary.json", "work"}):  # not left by a check
            raise ValueError(f"GPU_CHECK_OUT={out} holds files a check did not write ({sorted(names)[:5]}): "
                             f"name an empty or new folder")
        for p in out.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (out / "work").mkdir(parents=True)


def publish_from(tarball: Path, dest: Path = ROOT / "benchmarks" / "results") -> list[Path]:
    """Copy the benchmark result files inside a check's results.tar.gz into `dest`, ready to commit."""
    if not tarball.is_file():
        raise ValueError(f"--publish-from needs the results.tar.gz a GPU check wrote, got {tarball}")
    copied = []
    with tarfile.open(tarball) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            # gpu-check/results/<step>/<stem>-<gpu>.<ext>; the fake plan's results are not published
            if m.isfile() and len(parts) == 4 and parts[1] == "results" and parts[2] != "fake":
                dest.mkdir(parents=True, exist_ok=True)
                target = dest / Path(m.name).name
                target.write_bytes(tar.extractfile(m).read())
                copied.append(target)
    return copied
