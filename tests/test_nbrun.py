"""course.nbrun: the kernel manager make course and make site execute notebooks with.

A missed wake-up of a socket poll cannot be caused on demand in a real kernel (it is a race: 3 of 4
`make course` runs here), so the channel is checked against a stand-in poll that misses on purpose, then
the real thing is run once: the Makefile's own nbconvert flags on a small notebook with a widget cell.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
import pytest
from jupyter_client.channels import AsyncZMQSocketChannel

from course import nbrun

ROOT = Path(__file__).resolve().parents[1]
MESSAGE = {"header": {"msg_type": "execute_reply"}, "parent_header": {"msg_id": "m"}, "content": {}}


class MissingPoll:
    """A stand-in for one zmq poll: the first `misses` polls wait out their timeout and see nothing, though
    the message is there (a missed wake-up); the next returns it. `never`: no poll ever sees it."""

    def __init__(self, misses: int, never: bool = False) -> None:
        self.misses, self.never, self.timeouts = misses, never, []

    async def __call__(self, timeout: float | None = None) -> dict:
        self.timeouts.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded poll: a missed wake-up would wait for ever")
        if self.never or len(self.timeouts) <= self.misses:
            await asyncio.sleep(timeout)
            raise Empty
        return MESSAGE


def _stand_in(poll: MissingPoll, monkeypatch: pytest.MonkeyPatch) -> None:
    """jupyter_client's one poll (AsyncZMQSocketChannel.get_msg, what SlicedChannel slices) -> `poll`."""
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", lambda channel, timeout=None: poll(timeout))


def _get(timeout: float | None, poll: MissingPoll, monkeypatch: pytest.MonkeyPatch) -> tuple[object, float]:
    _stand_in(poll, monkeypatch)
    monkeypatch.setattr(nbrun, "SLICE_S", 0.05)
    channel = nbrun.SlicedChannel.__new__(nbrun.SlicedChannel)  # no socket: the stand-in poll replaces it
    start = time.monotonic()
    try:
        result: object = asyncio.run(channel.get_msg(timeout=timeout))
    except Empty as e:
        result = e
    return result, time.monotonic() - start


@pytest.mark.parametrize("timeout", [None, 3600.0])  # nbclient's two waits: iopub (none), shell (the cell's)
def test_a_missed_wake_up_costs_one_slice_not_the_timeout(timeout, monkeypatch):
    poll = MissingPoll(misses=2)
    result, seconds = _get(timeout, poll, monkeypatch)
    assert result is MESSAGE
    assert len(poll.timeouts) == 3 and all(t is not None and t <= 0.05 for t in poll.timeouts), poll.timeouts
    assert seconds < 5, seconds  # two slices of 0.05 s, with room for a slow machine


def test_a_timeout_still_raises_empty_on_time(monkeypatch):
    result, seconds = _get(0.3, MissingPoll(misses=0, never=True), monkeypatch)
    assert isinstance(result, Empty)
    assert 0.3 <= seconds < 3, seconds
    poll = MissingPoll(misses=0, never=True)
    result, _ = _get(0, poll, monkeypatch)  # nbclient's non-blocking read: one poll, no wait
    assert isinstance(result, Empty) and poll.timeouts == [0]


def test_the_planted_pass_through_poll_fails_the_check(monkeypatch):
    """Planted: a channel that hands nbclient's timeout to one poll, as jupyter_client's does."""

    class PassThrough(nbrun.SlicedChannel):
        async def get_msg(self, timeout=None):
            return await AsyncZMQSocketChannel.get_msg(self, timeout=timeout)

    _stand_in(MissingPoll(misses=2), monkeypatch)
    with pytest.raises(AssertionError, match="unbounded poll"):
        asyncio.run(PassThrough.__new__(PassThrough).get_msg(timeout=None))


WIDGET_CELL = """
import ipywidgets
from IPython.display import clear_output, display
out = ipywidgets.Output()
for i in range(3):  # what course.widgets.AttentionExplorer does when it redraws
    with out:
        clear_output(wait=True)
        print("frame", i)
display(out)
print("done")
"""


def test_make_courses_flags_run_a_widget_notebook_with_sliced_channels(tmp_path):
    """The Makefile's EXECUTE flags, as `make course` passes them to nbconvert, run a widget cell; and the
    manager they name hands nbclient sliced shell and iopub channels."""
    line = re.search(r"^EXECUTE := (.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert line, "the Makefile has no EXECUTE := line (make course's nbconvert flags)"
    flags = line.group(1).split()
    assert "--ExecutePreprocessor.kernel_manager_class=course.nbrun.CourseKernelManager" in flags
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WIDGET_CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "w.ipynb")
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", *flags,
                    "--output-dir", str(tmp_path / "out"), str(tmp_path / "w.ipynb")],
                   check=True, cwd=tmp_path)
    outputs = nbformat.read(tmp_path / "out" / "w.ipynb", as_version=4).cells[0].outputs
    assert any("done" in o.get("text", "") for o in outputs), outputs

    from nbclient import NotebookClient

    client = NotebookClient(nb, kernel_manager_class=nbrun.CourseKernelManager, kernel_name="python3")
    with client.setup_kernel():
        assert isinstance(client.kc.shell_channel, nbrun.SlicedChannel)
        assert isinstance(client.kc.iopub_channel, nbrun.SlicedChannel)
