"""Run notebooks headless without nbclient's lost-reply hang (`make course`, `make site`, tests/hosted.py).

nbclient (0.10, 0.11) waits for a cell's reply with one poll of the kernel's shell socket as long as the
cell's timeout, and reads outputs with one unbounded poll of the iopub socket, both through zmq.asyncio. Such
a poll can miss its wake-up: the reply is in the socket, the kernel is idle, and the run waits out the whole
timeout, or for ever with none (jupyter/nbclient#312, open; seen here at lesson 01's attention-explorer cell
in 3 of 4 `make course` runs). A poll that starts finds a message already waiting, so the channel below polls
in slices of `SLICE_S`: a missed wake-up costs at most one slice. Nothing else changes, and it uses
jupyter_client's public classes only (the channel classes of a kernel client, the client class of a kernel
manager), so nbconvert takes it as a flag:

    jupyter nbconvert --execute --ExecutePreprocessor.kernel_manager_class=course.nbrun.CourseKernelManager
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

__all__ = ["SLICE_S", "SlicedChannel", "CourseKernelClient", "CourseKernelManager"]

SLICE_S = 1.0  # seconds one poll waits at most; a missed wake-up costs this much, a busy run ~nothing


class SlicedChannel(AsyncZMQSocketChannel):
    """A kernel channel whose long waits are short polls in a row (no lesson: make course, make site)."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:  # type: ignore[override]
        """The next message, waiting at most `timeout` seconds (None: no limit) -> raises queue.Empty."""
        if timeout is not None and timeout <= SLICE_S:
            return await super().get_msg(timeout=timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=max(left, 0.0))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class CourseKernelClient(AsyncKernelClient):
    """jupyter_client's async kernel client with sliced shell and iopub channels (no lesson: make course)."""

    shell_channel_class = Type(SlicedChannel)
    iopub_channel_class = Type(SlicedChannel)


class CourseKernelManager(AsyncKernelManager):
    """The kernel manager that make course, make site and the hosted-lesson test give nbclient."""

    # both traits: AsyncKernelManager's own client_factory default ignores client_class (jupyter_client 8.10)
    client_class = DottedObjectName("course.nbrun.CourseKernelClient")
    client_factory = Type(CourseKernelClient, klass=AsyncKernelClient)
