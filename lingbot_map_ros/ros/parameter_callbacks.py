"""``ros2 param set`` on the running node: what is accepted, and who applies it.

Two callbacks on the executor thread. Before a change (``on_set``): validate the new values against
the settings table, and for a change that needs a new model check the checkpoint, preset, device and
memory now, so that "Set parameter successful" means the model will be built. After it
(``on_set_post``): swap in the new settings (``LiveSettings``, one swap per change), then route
each change to where it applies: the subscription, the diagnostics timer, or an "apply" command for
the inference thread (model and session changes; ``SessionManager.apply`` decides what they need).
``revert_model_parameters`` undoes a model change whose build failed anyway.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import rclpy.parameter
from rcl_interfaces.msg import SetParametersResult

from ..core.settings import CORE_FIELDS, DEPTH_OUTPUTS
from .commands import ApplyParameters
from .node_settings import LiveSettings
from .node_state import ConfiguredParts, RestartableTimer
from .parameters import RUNTIME_FIELDS, SPECS, configs_from_values, validate_values

if TYPE_CHECKING:  # annotations only
    from .inference import SessionView
    from .intake import ImageIntake


class ParameterHandler:
    """The node's parameter callbacks, and the one writer of its ``LiveSettings``.

    ``session_view`` is the session manager's latest read-only view (``runtime`` None when
    unconfigured); a change re-creates ``intake``'s subscription, restarts ``timer`` (diagnostics) or
    is queued through ``parts`` for the inference thread.
    """

    def __init__(self, node, settings: LiveSettings, session_view: "SessionView", intake: "ImageIntake",
                 timer: RestartableTimer, parts: ConfiguredParts):
        self._node = node
        self._settings = settings
        self._session_view = session_view
        self._intake = intake
        self._timer = timer
        self._parts = parts

    def on_set(self, params) -> SetParametersResult:
        current = self._settings.current
        values = current.values()
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
        view = self._session_view.read()  # data only: the inference thread may be swapping the model meanwhile
        problems = view.memory_problems(runtime, stream)  # a change that would not fit the budget (docs/memory.md)
        if problems:
            return SetParametersResult(successful=False, reason="; ".join(problems))
        running = view.runtime
        if running is not None and runtime != running and runtime != current.configs()[0]:
            # A new model: check the file, its keys and shapes, the device and its memory now.
            from ..core.model_host import model_change_problems

            problems = model_change_problems(runtime)
            if problems:
                return SetParametersResult(successful=False, reason="; ".join(problems))
        return SetParametersResult(successful=True)

    def on_set_post(self, params) -> None:
        changed = self._settings.update({p.name: p.value for p in params})  # one swap for the whole change
        if not changed:
            return
        settings = self._settings.current
        log = self._node.get_logger()
        log.info("parameters changed: " + ", ".join(f"{n}={_shown(getattr(settings, n))!r}" for n in changed))
        applies = {SPECS[n].applies for n in changed}
        if "subscription" in applies:
            self._intake.resubscribe()
        if "timer" in applies:
            self._timer.restart(settings.diagnostics_period)
        # the manager applies every change of a core field (a new model, a new session or from the next
        # frame, as the settings table says) and of the outputs that switch the depth head on or off
        if self._session_view.read().runtime is not None and set(changed) & (CORE_FIELDS | set(DEPTH_OUTPUTS)):
            self._parts.submit(ApplyParameters(changed))

    def revert_model_parameters(self, runtime) -> None:
        """Put the model parameters back to the values the running model was built from, so that
        ``ros2 param get`` never shows a value the model does not use and no later change retries
        the failed build (inference thread).

        The settings are swapped first, through the same ``LiveSettings.update`` (and its lock) as a
        parameter change of the executor thread; ``set_parameters`` then runs the post-set callback
        here, which finds nothing left to change and queues nothing."""
        self.revert_parameters({name: getattr(runtime, name) for name in RUNTIME_FIELDS})

    def revert_parameters(self, in_use: Mapping[str, Any]) -> None:
        """Put the parameters named in ``in_use`` back to those values (the ones the running model and
        streams use), through the one owner of the settings; see ``revert_model_parameters``."""
        stale = self._settings.update(dict(in_use))
        if not stale:
            return
        settings = self._settings.current
        self._node.set_parameters([rclpy.parameter.Parameter(k, value=getattr(settings, k)) for k in stale])
        self._node.get_logger().warning("reverted " + ", ".join(f"{k}={getattr(settings, k)!r}" for k in stale))


def _shown(value):
    """A value as the log shows it: the list the user set (a tuple in the settings)."""
    return list(value) if isinstance(value, tuple) else value
