"""Start Jupyter Lab the way `make lab` does, for tests that talk to it over HTTP or drive it in a browser.

    from labserver import lab_server      # tests/ is on sys.path under pytest
    with lab_server(env={"COURSE_PROFILE": "smoke"}) as lab:
        requests_get(lab.url + "api/status", headers={"Authorization": f"token {lab.token}"})

`lab_server()` runs `make -s lab LAB_PORT=<free port> LAB_ARGS="--no-browser ..." LESSONS=<folder>` from the
repository root (LESSONS: the folder Lab serves, notebooks/ by default, which `make lab` then copies nothing
into) with a fresh random `JUPYTER_TOKEN` in the environment, waits until the server answers, yields a
`LabServer` (base URL, token, port, log file) and, on exit, asks the server to shut down (which stops
its kernels) and then ends the process group it started, children included.

Make is told not to rebuild the set-up stamp (`make -o`): tests run after set-up, and the interpreter
running the tests is the one Lab runs on (`PY=sys.executable`), so its `python3` kernel is that
interpreter. Lab's settings and workspaces go to a temp dir, so nothing of the user's ~/.jupyter is used
or changed. Jupyter Lab is left exactly as `make lab` configures it otherwise (127.0.0.1, token auth on).

"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REPO_ROOT", "LabServer", "free_port", "lab_command", "lab_server", "api_request"]

REPO_ROOT = Path(__file__).resolve().parent.parent
STAMP = ".course-installed"  # the Makefile's set-up stamp inside the venv: $(VENV)/.course-installed


@dataclass(frozen=True)
class LabServer:
    """A running Jupyter Lab: where it answers and the token it wants."""

    url: str  # base URL ending in "/", e.g. "http://127.0.0.1:8931/"
    token: str
    port: int
    pid: int  # the process started (make), leader of its own process group
    log_path: Path  # the server's stdout and stderr

    def lab_url(self, path: str = "") -> str:
        """URL of `path` in Lab (e.g. "tree/00_setup.ipynb"), with the token so a browser logs in."""
        return f"{self.url}lab/{path}?token={self.token}"

    def log(self) -> str:
        """The server's output so far (for error messages)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lab_command(port: int, extra_args: Sequence[str] = (), lessons: str | os.PathLike[str] | None = None
                ) -> list[str]:
    """The `make lab` command line for `port`: no browser opened, set-up stamp not rebuilt; `lessons` is the
    folder make lab copies the lessons into and serves (its default, my-lessons/, when None)."""
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    lab_args = " ".join(["--no-browser", *extra_args])  # as root, `make lab` adds --allow-root itself
    venv = Path(sys.executable).parent.parent  # $(VENV): the stamp make must leave alone is inside it
    return ["make", "-s", "-f", str(REPO_ROOT / "Makefile"), "-o", str(venv / STAMP), "lab",
            f"VENV={venv}", f"PY={sys.executable}", f"LAB_PORT={port}", f"LAB_ARGS={lab_args}",
            *([f"LESSONS={Path(lessons).resolve()}"] if lessons is not None else [])]


def api_request(url: str, token: str | None = None, method: str = "GET",
                timeout: float = 10.0) -> tuple[int, object]:
    """HTTP `method` on `url` (token in the Authorization header when given) -> (status, JSON or text)."""
    req = urllib.request.Request(url, method=method, data=b"" if method in ("POST", "PUT") else None)
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (local test server)
            status, body = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode(errors="replace")
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc; empty elsewhere): kernels live in their own sessions."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))  # fields[1] = ppid
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_lab(proc: subprocess.Popen, server: LabServer | None = None, grace_s: float = 15.0) -> None:
    """Shut the server down politely, then end its process group and any stray descendant."""
    if proc.poll() is not None:
        return
    family = _descendants(proc.pid)
    if server is not None:  # POST /api/shutdown stops the kernels too
        try:
            api_request(server.url + "api/shutdown", server.token, method="POST", timeout=5)
            proc.wait(timeout=grace_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    for pid in family:  # kernels run in sessions of their own: not reached by killpg
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.wait(timeout=grace_s)


@contextmanager
def lab_server(
    notebook_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str | None] | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 120.0,
    grace_s: float = 10.0,
) -> Iterator[LabServer]:
    """Run Jupyter Lab via `make lab` on a free port of 127.0.0.1 with a random token; stop it on exit.

    notebook_dir: serve this folder instead of notebooks/ (e.g. a scratch folder in a test), as it is;
    env: extra environment for the server and its kernels (e.g. COURSE_PROFILE=smoke; a None value removes
         the variable, e.g. MPLBACKEND, so kernels draw inline figures); JUPYTERLAB_SETTINGS_DIR may be given;
    extra_args: more Jupyter options, appended to LAB_ARGS; timeout_s: how long to wait for it to answer.
    """
    if notebook_dir is not None and not Path(notebook_dir).is_dir():
        raise ValueError(f"notebook_dir must be an existing folder, got {notebook_dir!r}")
    port = free_port()
    token = secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="course-lab-") as tmp:
        tmp_path = Path(tmp)
        server_env = {
            **os.environ,
            "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),  # the caller's env may replace these two
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
            **(env or {}),
            "JUPYTER_TOKEN": token,  # Jupyter reads its token from here; never printed by the tests
        }
        # None in `env` removes a variable
        server_env = {k: v for k, v in server_env.items() if v is not None}
        # served as it is: `make lab` copies the lessons into LESSONS only when it is another folder
        lessons = Path(notebook_dir) if notebook_dir is not None else REPO_ROOT / "notebooks"
        log_path = tmp_path / "server.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(lab_command(port, extra_args, lessons), cwd=REPO_ROOT, env=server_env,
                                    stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        server = LabServer(url=f"http://127.0.0.1:{port}/", token=token, port=port, pid=proc.pid,
                           log_path=log_path)
        answered = None
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"Jupyter Lab exited with code {proc.returncode} before answering:\n"
                                       + server.log()[-3000:])
                try:
                    status, _ = api_request(server.url + "api/status", token, timeout=2)
                    if status == 200:
                        answered = server
                        break
                except OSError:
                    pass  # not listening yet
                time.sleep(0.25)
            if answered is None:
                raise RuntimeError(f"Jupyter Lab did not answer on {server.url} within {timeout_s:.0f} s:\n"
                                   + server.log()[-3000:])
            yield server
        finally:
            stop_lab(proc, answered, grace_s)
