"""The ROS 2 layer: the managed node, its parameters, message builders, diagnostics, image decoding.

Thin by design: it converts messages, owns parameters, QoS and threads, and publishes what the core
returns. Every decision about the model and the cache lives in ``lingbot_map_ros.core``.
"""
