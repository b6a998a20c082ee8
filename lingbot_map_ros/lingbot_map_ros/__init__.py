"""lingbot_map_ros: LingBot-Map streaming 3D reconstruction for ROS 2.

The torch core (``config``, ``model``, ``cache``, ``stream``, ``preprocess``, ``geometry``) imports
no rclpy; the ROS layer (``node``, ``image_io``, ``tools``) is thin on top of it.
"""
__version__ = "0.1.0"
