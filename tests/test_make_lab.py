"""`make lab`, the README's first command, run as a user runs it: also as root (issue 13).

The test starts `make lab` itself (tests/labserver.py's command line: a free port, no browser, the set-up
stamp left alone, the learner's copy of the lessons in a temporary folder) WITHOUT choosing a token, reads
the URL Jupyter prints, checks the token it carries is required, that the lessons were copied into the
learner's folder and said so, and ends the whole process group. As root (the usual user in containers and on
cloud GPU boxes), Jupyter refuses to start without --allow-root: before the fix, `make lab` exited at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from labserver import REPO_ROOT, api_request, free_port, lab_command, stop_lab  # tests/labserver.py

URL = re.compile(r"(http://127\.0\.0\.1:(\d+)/)lab\?token=([0-9a-f]+)")
ROOT_LINE = "make lab: running as root"
COPY_LINE = "make lab: your copy of the lessons is "


def test_make_lab_starts_for_this_user_with_token_auth_on_loopback():
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="make-lab-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}  # Jupyter makes its own token
        env.update(JUPYTERLAB_SETTINGS_DIR=f"{tmp}/settings", JUPYTERLAB_WORKSPACES_DIR=f"{tmp}/workspaces",
                   JUPYTER_RUNTIME_DIR=f"{tmp}/runtime")
        log_path = Path(tmp) / "lab.log"
        with log_path.open("wb") as log:
            lessons = Path(tmp) / "my-lessons"
            proc = subprocess.Popen(lab_command(port, lessons=lessons), cwd=REPO_ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        try:
            found, deadline = None, time.monotonic() + 120
            while found is None and time.monotonic() < deadline:
                assert proc.poll() is None, f"`make lab` exited ({proc.returncode}):\n{log_path.read_text()}"
                found = URL.search(log_path.read_text(errors="replace"))
                time.sleep(0.25)
            output = log_path.read_text(errors="replace")
            assert found, f"`make lab` printed no http://127.0.0.1 URL with a token within 120 s:\n{output}"
            base, url_port, token = found.group(1), int(found.group(2)), found.group(3)
            assert url_port == port
            is_root = os.geteuid() == 0
            assert (ROOT_LINE in output) == is_root, output  # said once, and only as root
            assert f"{COPY_LINE}{lessons}/" in output and "copied 00_setup.ipynb" in output, output
            committed = sorted(p.name for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))
            assert sorted(p.name for p in lessons.glob("*.ipynb")) == committed
            status, body = 0, None
            for _ in range(40):  # the URL is printed just before the server answers
                try:
                    status, body = api_request(base + "api/status", token=token, timeout=5)
                    break
                except OSError:
                    time.sleep(0.25)
            assert status == 200 and "started" in body, (status, body)
            status, _ = api_request(base + "api/status")  # no token
            assert status in (401, 403)
            status, _ = api_request(base + "api/contents", token=token[::-1])  # a wrong one
            assert status in (401, 403)
        finally:
            stop_lab(proc)  # make, the shell, Jupyter and its kernels
    assert proc.poll() is not None
