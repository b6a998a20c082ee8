"""lingbot_map_ros: ament_python package (also pip-installable) for LingBot-Map streaming on ROS 2."""
from glob import glob

from setuptools import find_packages, setup

PACKAGE = "lingbot_map_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        # ament index marker + manifest: lets `ros2 run` / `ros2 launch` find the package.
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    install_requires=["setuptools", "numpy", "torch", "pillow"],
    extras_require={
        "gpu": ["flashinfer-python>=0.6.18,<0.7"],  # tested: 0.6.18.post1 (docs/benchmarks.md)
        "io": ["opencv-python-headless", "rosbags", "rosbags-image", "safetensors"],
        "test": ["pytest", "hypothesis", "psutil"],
    },
    zip_safe=True,
    maintainer="lingbot_map_ros developers",
    maintainer_email="dev@lingbot-map-ros.invalid",
    description="Streaming LingBot-Map 3D reconstruction as a ROS 2 node: poses, TF, KV-cache diagnostics.",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            f"lingbot_map_node = {PACKAGE}.node:main",
            f"lingbot_map_demo = {PACKAGE}.tools.demo:main",
            f"lingbot_map_offline = {PACKAGE}.tools.offline:main",
            f"lingbot_map_bench = {PACKAGE}.tools.bench:main",
            f"lingbot_map_replay = {PACKAGE}.tools.replay:main",
            f"lingbot_map_eval = {PACKAGE}.tools.evaluate:main",
        ],
    },
)
