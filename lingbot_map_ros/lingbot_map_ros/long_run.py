"""Long-run policies around the streaming session (MODEL_SPEC §15; issue 5).

``make_session`` is the one factory the node and the tools use, so the policy in force is chosen in
one place.
"""
from __future__ import annotations

from typing import Callable

from .config import RuntimeConfig, StreamConfig
from .stream import StreamingSession


def make_session(runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print) -> StreamingSession:
    return StreamingSession.from_config(runtime, stream, log=log)
