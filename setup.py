"""pip install of lingbot_map_ros's Python code: the core and the tools, without ROS.

On a robot the package is built with colcon from CMakeLists.txt (messages, executables, launch and
config files); colcon ignores this file. ``pip install .`` gives the same console scripts for the
parts that need no ROS (``lingbot_map_offline``, ``lingbot_map_bench``, ``lingbot_map_eval``,
``lingbot_map_benchmark``, ``lingbot_map_batch``; eval and benchmark with the ``eval`` extra, which
brings evo; ``--ray`` with the ``ray`` extra);
the node and the demo need the ROS environment that ``scripts/setup_env.sh`` builds.
"""
from setuptools import find_packages, setup

PACKAGE = "lingbot_map_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    install_requires=["numpy", "torch", "pillow", "opencv-python-headless"],
    extras_require={
        "gpu": ["flashinfer-python>=0.6.18,<0.7"],  # tested: 0.6.18.post1 (on the H200)
        "io": ["rosbags", "rosbags-image", "safetensors"],
        "eval": ["evo==1.38.1", "matplotlib"],  # lingbot_map_eval, lingbot_map_benchmark (scripts/setup_env.sh pins)
        "ray": ["ray==2.60.0"],  # --ray of lingbot_map_benchmark and lingbot_map_batch (many GPUs, many nodes)
        "test": ["pytest", "hypothesis", "psutil"],
    },
    python_requires=">=3.10",
    zip_safe=False,
    maintainer="lingbot_map_ros developers",
    maintainer_email="dev@lingbot-map-ros.invalid",
    description="Streaming LingBot-Map 3D reconstruction as a ROS 2 node: poses, TF, KV-cache diagnostics.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            f"lingbot_map_node = {PACKAGE}.ros.node:main",
            f"lingbot_map_demo = {PACKAGE}.tools.demo:main",
            f"lingbot_map_offline = {PACKAGE}.tools.offline:main",
            f"lingbot_map_bench = {PACKAGE}.tools.bench:main",
            f"lingbot_map_replay = {PACKAGE}.tools.replay:main",
            f"lingbot_map_eval = {PACKAGE}.tools.evaluate:main",
            f"lingbot_map_benchmark = {PACKAGE}.tools.benchmark:main",
            f"lingbot_map_batch = {PACKAGE}.tools.batch:main",
        ],
    },
)
