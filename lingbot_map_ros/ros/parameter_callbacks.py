"""``ros2 param set`` on the running node: what is accepted, and who applies it.

Two callbacks on the executor thread. Before a change (``on_set``): validate the new values against
the settings table, and for a change that needs a new model check the checkpoint, preset, device and
memory now, so that "Set parameter successful" means the model will be built. After it
(``on_set_post``): store the values, then route each change to where it applies: the subscription,
the diagnostics timer, or an "apply" command for the inference thread (model and session changes;
``SessionManager.apply`` decides what they need). ``revert_model_parameters`` undoes a model change
whose build failed anyway.
"""
from __future__ import annotations

from typing import Callable

import rclpy.parameter
from rcl_interfaces.msg import SetParametersResult

from ..core.session_manager import ManagerView
from ..core.settings import CORE_FIELDS, DEPTH_OUTPUTS
from .parameters import RUNTIME_FIELDS, SPECS, configs_from_values, validate_values


class ParameterHandler:
    """The node's parameter callbacks.

    ``get_view()`` is the session manager's latest read-only view (``runtime`` None when unconfigured);
    ``resubscribe()`` re-creates the image subscription; ``restart_timer()`` the diagnostics timer;
    ``submit_apply(changed)`` queues the change for the inference thread.
    """

    def __init__(self, node, values: dict, get_view: Callable[[], ManagerView],
                 resubscribe: Callable[[], None], restart_timer: Callable[[], None],
                 submit_apply: Callable[[list], None]):
        self._node = node
        self._values = values
        self._get_view = get_view
        self._resubscribe = resubscribe
        self._restart_timer = restart_timer
        self._submit_apply = submit_apply

    def on_set(self, params) -> SetParametersResult:
        values = dict(self._values)
        for p in params:
            if p.name not in SPECS:
                continue
            if SPECS[p.name].read_only:
                return SetParametersResult(successful=False, reason=f"{p.name} is read-only")
            values[p.name] = p.value
        problems = validate_values(values)
        if problems:
            return SetParametersResult(successful=False, reason="; ".join(problems))
        runtime, stream = configs_from_values(values)
        view = self._get_view()  # data only: the inference thread may be swapping the model meanwhile
        problems = view.memory_problems(runtime, stream)  # a change that would not fit the budget (docs/memory.md)
        if problems:
            return SetParametersResult(successful=False, reason="; ".join(problems))
        running = view.runtime
        if running is not None and runtime != running and runtime != configs_from_values(self._values)[0]:
            # A new model: check the file, its keys and shapes, the device and its memory now.
            from ..core.model_host import model_change_problems

            problems = model_change_problems(runtime)
            if problems:
                return SetParametersResult(successful=False, reason="; ".join(problems))
        return SetParametersResult(successful=True)

    def on_set_post(self, params) -> None:
        changed = [p.name for p in params if p.name in SPECS and self._values.get(p.name) != p.value]
        if not changed:
            return
        for p in params:
            if p.name in SPECS:
                self._values[p.name] = p.value
        log = self._node.get_logger()
        log.info("parameters changed: " + ", ".join(f"{n}={self._values[n]!r}" for n in changed))
        applies = {SPECS[n].applies for n in changed}
        if "subscription" in applies:
            self._resubscribe()
        if "timer" in applies:
            self._restart_timer()
        # the manager applies every change of a core field (a new model, a new session or from the next
        # frame, as the settings table says) and of the outputs that switch the depth head on or off
        if self._get_view().runtime is not None and set(changed) & (CORE_FIELDS | set(DEPTH_OUTPUTS)):
            self._submit_apply(changed)

    def revert_model_parameters(self, runtime) -> None:
        """Put the model parameters back to the values the running model was built from, so that
        ``ros2 param get`` never shows a value the model does not use and no later change retries
        the failed build (inference thread)."""
        active = {name: getattr(runtime, name) for name in RUNTIME_FIELDS}
        stale = {k: v for k, v in active.items() if self._values.get(k) != v}
        if not stale:
            return
        self._values.update(stale)  # first: the post-set callback then sees nothing to apply
        self._node.set_parameters([rclpy.parameter.Parameter(k, value=v) for k, v in stale.items()])
        self._node.get_logger().warning("reverted " + ", ".join(f"{k}={v!r}" for k, v in stale.items()))
