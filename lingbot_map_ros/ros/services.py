"""``~/reset``, ``~/save_trajectory``, ``~/save_session`` and ``~/load_session`` (executor thread).

``~/reset`` never touches the session itself: it queues a command for the inference thread and
waits for it (up to 30 s), so the reset lands between two frames. The two session services take
seconds for a full session (gigabytes), so their callbacks are coroutines in a callback group of
their own: each hands its work to a thread of its own and awaits it, and the node's single-threaded
executor runs the image callbacks and everything else meanwhile (``test/test_session_services.py``).
``~/save_session`` has the inference thread copy the session between two frames (``SessionCapture``:
inside device memory where it has room, milliseconds, else to the host) and writes the copy here.
``~/load_session`` reads and checks ``session_path`` here (``prepare_load``: staged in device memory
where it has room) and has the inference thread commit it between two frames.
``~/save_trajectory`` copies the trajectory under its lock and writes a TUM file through a temporary
file and a rename, so a crash or a SIGTERM never leaves half a file behind.
"""
from __future__ import annotations

import os
import threading
from typing import Optional, Protocol

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.task import Future
from std_srvs.srv import Trigger

from ..core.session_store import SessionFileError
from ..core.trajectory import write_tum
from .commands import Command, CommandResult, LoadSession, Reset, SaveSession
from .node_settings import SettingsSource
from .node_state import ConfiguredParts, NodeState

RESET_WAIT_S = 30.0
SESSION_WAIT_S = 600.0


class TrajectorySource(Protocol):
    """What ``~/save_trajectory`` writes (``outputs.ResultPublisher``)."""

    def trajectory(self) -> tuple[list, Optional[int]]: ...


class NodeServices:
    """The node's Trigger services.

    ``state`` names the lifecycle state for a refusal; ``parts`` says whether a model is loaded, runs
    a command on the inference thread (``submit``: its ``CommandResult``, None when it has not run
    within the wait; a save's carries the copy) and reads and checks a saved session on the calling
    thread (``prepare_load``); ``trajectory`` holds the current session's (stamp, c2w) list and its id.
    """

    def __init__(self, node, settings: SettingsSource, state: NodeState, parts: ConfiguredParts,
                 trajectory: TrajectorySource):
        self._node = node
        self._settings = settings
        self._state = state
        self._parts = parts
        self._trajectory = trajectory
        node.create_service(Trigger, "~/reset", self.on_reset)
        node.create_service(Trigger, "~/save_trajectory", self.on_save_trajectory)
        # a group of their own: while one awaits its thread, the node's default (mutually exclusive) group,
        # the image callbacks' one, stays free; one session operation at a time
        self.session_group = MutuallyExclusiveCallbackGroup()
        node.create_service(Trigger, "~/save_session", self.on_save_session, callback_group=self.session_group)
        node.create_service(Trigger, "~/load_session", self.on_load_session, callback_group=self.session_group)

    async def on_save_session(self, request, response):
        return await self._off_the_executor("save_session", response)

    async def on_load_session(self, request, response):
        return await self._off_the_executor("load_session", response)

    async def _off_the_executor(self, kind: str, response):
        """Run ``_on_session`` on a thread of its own and await it: the executor goes on meanwhile.

        The future wakes the executor when it is done (its done callback is scheduled as a task),
        so the coroutine resumes at once."""
        done: Future = Future(executor=self._node.executor)
        done.add_done_callback(lambda _: None)

        def work() -> None:
            try:
                done.set_result(self._on_session(kind, response))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting callback
                done.set_exception(exc)

        threading.Thread(target=work, name=f"lingbot_map_{kind}", daemon=True).start()
        return await done

    def _on_session(self, kind: str, response):
        """Save or load ``session_path`` (a thread of its own); its refusal reason is the message."""
        if not self._parts.configured:
            response.success = False
            response.message = f"the node is {self._state.label}: configure it first"
            return response
        path = os.path.abspath(os.path.expanduser(self._settings.current.session_path))
        command: Command = SaveSession()
        if kind == "load_session":
            try:
                command = LoadSession(self._parts.prepare_load(path))  # read, checked and staged while frames go on
            except Exception as exc:  # noqa: BLE001 - any refusal is the service's answer; the session is kept
                response.success, response.message = False, f"error: {exc}"
                self._node.get_logger().error(f"load_session refused: {exc}")
                return response
        result = self._parts.submit(command, SESSION_WAIT_S)
        if result is not None and result.capture is not None:  # save: copied between two frames, written here
            try:
                result = CommandResult(True, result.capture.write(path).message())
                self._node.get_logger().info(result.message)
            except SessionFileError as exc:
                result = CommandResult(False, str(exc))
        if result is None:
            response.success, response.message = False, f"{kind} of {path} did not finish within {SESSION_WAIT_S:.0f} s"
        else:
            response.success = result.ok
            response.message = result.message if result.ok else f"error: {result.message}"
        return response

    def on_reset(self, request, response):
        if not self._parts.configured:
            response.success = False
            response.message = f"the node is {self._state.label}: configure it first"
            return response
        result = self._parts.submit(Reset("~/reset called"), RESET_WAIT_S)
        response.success = result is None or result.ok
        response.message = result.message if result is not None else "reset queued: applies before the next frame"
        return response

    def on_save_trajectory(self, request, response):
        path = os.path.expanduser(self._settings.current.trajectory_path)
        trajectory, session_id = self._trajectory.trajectory()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            write_tum(path, np.array([s for s, _ in trajectory], np.float64),  # atomic: never half a file
                      np.array([m for _, m in trajectory], np.float64).reshape(-1, 4, 4))
        except OSError as exc:
            response.success = False
            response.message = f"cannot write {path}: {exc}"
            return response
        response.success = True
        response.message = f"wrote {len(trajectory)} poses of session {session_id} to {os.path.abspath(path)}"
        self._node.get_logger().info(response.message)
        return response
