"""The streaming core: model, paged KV cache, session, preprocessing, geometry.

Imports no rclpy and no ROS message package (``test/test_layout.py`` checks this), so it runs and
is tested without ROS, and the offline tools use exactly the code the node runs.
"""
