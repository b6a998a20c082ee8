"""What SIGINT and SIGTERM do to ``lingbot_map_node``: the first one stops it, cleanly, exactly once.

rclpy's own signal handler shuts the ROS context down, which ends ``executor.spin``. It then chains to
the Python-level handler that was installed before ``rclpy.init``. Python's default handler raises
KeyboardInterrupt, and Python runs it in the main thread *when it next gets there*. That can be inside
the teardown, after the spin already ended through the context. A second signal can land there too:
Ctrl-C pressed twice, or ``ros2 launch`` sending SIGTERM after SIGINT. A KeyboardInterrupt raised
there skips the joins of the preprocessing and inference threads and ends the process with -2 after
all. CI saw that once: ``ros2 launch`` reported the node as died.

``StopSignals`` is the Python-level handler this node installs instead. While the node starts up (it
builds the model, which can take seconds), the first signal still raises KeyboardInterrupt, so a
start-up is stopped at once. Once ``spinning()`` is called, a signal raises nothing: the context
shutdown ends the spin. Every signal after the first is printed and ignored. The teardown is bounded
(every join has a timeout), and a process that must go at once still has SIGKILL. Once the node has
stopped (``stopped()``), both signals are ignored outright: what is left is the interpreter's own exit,
a few milliseconds with only daemon threads, and a signal landing there would turn exit 0 into -2.
"""
from __future__ import annotations

import signal
from types import FrameType
from typing import Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """The node process's Python-level SIGINT/SIGTERM handler (see the module docstring)."""

    def __init__(self) -> None:
        self.received = 0
        self._spinning = False

    def install(self) -> "StopSignals":
        """Install it for SIGINT and SIGTERM. Call this from the main thread, before ``rclpy.init``,
        so rclpy's handler chains to it."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self)
        return self

    def spinning(self) -> None:
        """From now on the context shutdown is what ends the node; a signal only marks the stop."""
        self._spinning = True

    def stopped(self) -> None:
        """The node is down and said so: let nothing turn the clean exit into a signal death."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def __call__(self, signum: int, _frame: Optional[FrameType]) -> None:
        self.received += 1
        if self.received > 1:
            print(f"[lingbot_map] {signal.Signals(signum).name} again: already stopping (the threads finish "
                  f"the frame in hand; SIGKILL ends the process at once)", flush=True)
            return
        if not self._spinning:
            raise KeyboardInterrupt  # start-up (model build, autostart transitions) stops at once
