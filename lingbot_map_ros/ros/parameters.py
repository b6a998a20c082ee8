"""The node's ROS parameters: the core's settings table (``core/settings.py``) as ROS descriptors.

The table itself (names, defaults, ranges, descriptions, when a change applies) and the validation
live in the core, so the tools' CLI options and the node can never disagree; this module only adds
what ROS tools show: ``ros2 param describe`` prints the description, the range (which ROS also
enforces itself) and the additional constraints (allowed values, when a change applies).
"""
from __future__ import annotations

import re
from typing import Optional

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType
from rclpy.parameter import Parameter

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
from .node_settings import NodeSettings

# The names the node and the tests use for the table (a parameter is a setting seen from ROS).
ParamSpec = Setting
PARAMETERS = SETTINGS
PARAMETER_NAMES = SETTING_NAMES
SPECS = SETTINGS_BY_NAME


def descriptor(spec: Setting) -> ParameterDescriptor:
    """The descriptor ROS tools show for ``spec``; its range lets ROS refuse out-of-range values itself."""
    d = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    if isinstance(spec.default, list) and not spec.default:  # an empty default tells ROS no element type
        d.type = ParameterType.PARAMETER_STRING_ARRAY
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


def declare(node, spec: Setting) -> None:
    """Declare ``spec`` on ``node``. An empty string-array default (``cameras``) is declared by its type
    and then set to ``[]``: rclpy would type a bare ``[]`` as a byte array and refuse every list of
    names given later."""
    if isinstance(spec.default, list) and not spec.default:
        declared = node.declare_parameter(spec.name, Parameter.Type.STRING_ARRAY, descriptor(spec))
        if declared.type_ == Parameter.Type.NOT_SET:
            node.set_parameters([Parameter(spec.name, Parameter.Type.STRING_ARRAY, [])])
        return
    node.declare_parameter(spec.name, spec.default, descriptor(spec))


_RCLPY_INVALID_VALUE = re.compile(r"Invalid parameter value \((?P<value>.*)\) for parameter\. Reason: (?P<reason>.*)",
                                  re.S)
_RCLPY_WRONG_TYPE = re.compile(r"Trying to set parameter '[^']*' to '(?P<value>.*)' of type '(?P<got>\w+)', "
                               r"expecting type '(?P<want>\w+)'", re.S)


def declare_error(spec: Setting, exc: Exception) -> str:
    """One line, the parameter's name first, for a value ROS refused while declaring ``spec``.

    rclpy words it "Invalid parameter value (0) for parameter. Reason: Parameter scale_frames out of
    range. Min: 1, Max: 256, value: 0: scale_frames": the name comes last and twice, the range in
    rclpy's own words. This says "scale_frames: 0 is out of range [1, 256]" instead."""
    text = str(exc).strip()
    suffix = f": {spec.name}"
    if text.endswith(suffix):
        text = text[: -len(suffix)]
    wrong_type = _RCLPY_WRONG_TYPE.match(text)
    if wrong_type:
        return (f"parameter {spec.name}: {wrong_type['value']!r} is of type {wrong_type['got'].lower()}, "
                f"expected {wrong_type['want'].lower()} (default {spec.default!r})")
    invalid = _RCLPY_INVALID_VALUE.match(text)
    if invalid:
        if spec.range is not None and "out of range" in invalid["reason"]:
            lo, hi = spec.range
            return f"parameter {spec.name}: {invalid['value']} is out of range [{lo}, {hi}]"
        return f"parameter {spec.name}: invalid value {invalid['value']}: {invalid['reason']}"
    return f"parameter {spec.name}: {text}"


def staging_choice(settings: NodeSettings) -> Optional[bool]:
    """``session_staging`` as ``SessionManager``'s ``on_device``: None (auto: device memory where a copy
    fits) or False (host memory)."""
    return False if settings.session_staging == "host" else None


__all__ = ["PARAMETERS", "PARAMETER_NAMES", "RUNTIME_FIELDS", "SPECS", "STREAM_FIELDS", "ParamSpec",
           "configs_from_values", "declare", "declare_error", "descriptor", "staging_choice", "validate_values"]

