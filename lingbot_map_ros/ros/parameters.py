"""The node's ROS parameters: the core's settings table (``core/settings.py``) as ROS descriptors.

The table itself (names, defaults, ranges, descriptions, when a change applies) and the validation
live in the core, so the tools' CLI options and the node can never disagree; this module only adds
what ROS tools show: ``ros2 param describe`` prints the description, the range (which ROS also
enforces itself) and the additional constraints (allowed values, when a change applies).
"""
from __future__ import annotations

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

from ..core.settings import (
    APPLIES,
    RUNTIME_FIELDS,
    SETTING_NAMES,
    SETTINGS,
    SETTINGS_BY_NAME,
    STREAM_FIELDS,
    Setting,
    configs_from_values,
    validate_values,
)

# The names the node and the tests use for the table (a parameter is a setting seen from ROS).
ParamSpec = Setting
PARAMETERS = SETTINGS
PARAMETER_NAMES = SETTING_NAMES
SPECS = SETTINGS_BY_NAME


def descriptor(spec: Setting) -> ParameterDescriptor:
    """The descriptor ROS tools show for ``spec``; its range lets ROS refuse out-of-range values itself."""
    d = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    notes = []
    if spec.range is not None:
        lo, hi = spec.range
        if isinstance(spec.default, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
        else:
            d.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    if spec.choices is not None:
        notes.append("one of: " + ", ".join(repr(c) for c in spec.choices))
    notes.append(APPLIES[spec.applies])
    d.additional_constraints = "; ".join(notes)
    return d


__all__ = ["PARAMETERS", "PARAMETER_NAMES", "RUNTIME_FIELDS", "SPECS", "STREAM_FIELDS", "ParamSpec",
           "configs_from_values", "descriptor", "validate_values"]
