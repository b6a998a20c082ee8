"""launch_testing test of the installed launch file: ``launch_test test/launch_testing_lingbot_map.py``.

Starts ``lingbot_map.launch.py`` of the installed package (found through the ament index, like
``ros2 launch``) with a parameter file, an image-topic remap, a namespace and
``diagnostics_aggregator:=true``; waits for the managed node to be active, streams frames from this
process, checks poses, ``/tf`` and ``/diagnostics`` (and the aggregator: ``/diagnostics_agg`` where
diagnostic_aggregator is installed; where it is not, the caller checks the launch file's log line), then checks after
the shutdown that every process exited 0 and the node said "stopped cleanly".

Not named ``test_*.py``: pytest does not collect it (the launch_testing pytest plugin is off in
pytest.ini); ``test_launch_testing.py`` runs it with ``launch_test`` in a process of its own, with
its own ROS_DOMAIN_ID, as ament's launch tests run. Needs ROS_DOMAIN_ID and TMPDIR set by the caller.
"""
from __future__ import annotations

import os
import tempfile
import time
import unittest

import launch_testing
import launch_testing.actions
import launch_testing.asserts
import pytest
import yaml
from ament_index_python.packages import PackageNotFoundError, get_package_prefix, get_package_share_directory
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource

import launch

NAMESPACE = "lt"
NODE = f"/{NAMESPACE}/lingbot_map"
IMAGE_TOPIC = f"/{NAMESPACE}/camera/image_raw"
WORLD = "launch_test_world"
CAMERA_FRAME = "launch_test_cam"
FRAMES = 6
PROCESSED = 0
DIAG_NAMES = {"lingbot_map: input", "lingbot_map: inference", "lingbot_map: kv cache", "lingbot_map: backend",
              "lingbot_map: tf", "lingbot_map: scale"}


def _aggregator_installed() -> bool:
    try:
        get_package_prefix("diagnostic_aggregator")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.launch_test
def generate_test_description():
    """The package's own launch file, included as a user's launch file would include it."""
    params = dict(model_preset="tiny", device="cpu", scale_frames=2, sliding_window=3, camera_iterations=2,
                  qos_reliability="reliable", world_frame=WORLD, diagnostics_period=0.3)
    params_file = os.path.join(tempfile.mkdtemp(prefix="lingbot_launch_test_"), "params.yaml")
    with open(params_file, "w") as f:
        yaml.safe_dump({"/**": {"ros__parameters": params}}, f)
    launch_file = os.path.join(get_package_share_directory("lingbot_map_ros"), "launch", "lingbot_map.launch.py")
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(launch_file),
        launch_arguments={"image_topic": IMAGE_TOPIC, "params_file": params_file, "namespace": NAMESPACE,
                          "diagnostics_aggregator": "true"}.items(),
    )
    return launch.LaunchDescription([include, launch_testing.actions.ReadyToTest()]), {"params_file": params_file}


class TestLaunchedNode(unittest.TestCase):
    """While the launch runs: one test node in this process streams frames and listens."""

    @classmethod
    def setUpClass(cls) -> None:
        import rclpy
        from rclpy.context import Context

        from lingbot_map_ros.tools.node_client import Listener

        cls.rclpy = rclpy
        cls.ctx = Context()
        rclpy.init(context=cls.ctx, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
        cls.listener = Listener(NODE, IMAGE_TOPIC, context=cls.ctx, name="lingbot_launch_test")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.listener.close()
        cls.rclpy.shutdown(context=cls.ctx)

    def test_1_node_is_active_in_its_namespace(self, proc_output) -> None:
        proc_output.assertWaitFor("ready: active", timeout=150)
        self.assertTrue(self.listener.wait_connected(30), "the node's topics never matched ours")
        graph = self.listener.node.get_node_names_and_namespaces()
        self.assertIn(("lingbot_map", f"/{NAMESPACE}"), graph)

    def test_2_frames_give_poses_tf_and_diagnostics(self) -> None:
        from lingbot_map_ros.tools.node_client import SyntheticCamera, image_message

        lst, rx = self.listener, self.listener.rx
        camera = SyntheticCamera(64, 48, seed=9)
        stamps = []
        for i in range(FRAMES):  # one at a time: each frame is settled before the next is sent
            stamp = 1_800_000_000 * 10**9 + i * 100_000_000
            stamps.append(stamp)
            lst.pub.publish(image_message(camera.render(i), stamp, CAMERA_FRAME))
            self.assertTrue(
                lst.wait_for(lambda r: lst.final_status(stamp) is not None or (i == 0 and stamp in r.status), 60),
                f"no frame_status for frame {i}",
            )
        self.assertTrue(lst.wait_for(lambda r: all(lst.final_status(s) is not None for s in stamps), 60))
        self.assertEqual([lst.final_status(s).status for s in stamps], [PROCESSED] * FRAMES)
        self.assertTrue(lst.wait_for(lambda r: all(s in r.poses for s in stamps), 20), "missing poses")
        for s in stamps:
            self.assertEqual(rx.poses[s].header.frame_id, WORLD)  # from the parameter file
        self.assertTrue(lst.wait_for(lambda r: {(t.header.stamp.sec * 10**9 + t.header.stamp.nanosec)
                                                for m in r.tf for t in m.transforms} >= set(stamps), 20), "missing /tf")
        tf = {(t.header.frame_id, t.child_frame_id) for m in rx.tf for t in m.transforms}
        self.assertEqual(tf, {(WORLD, CAMERA_FRAME)})
        after = time.time()  # the node's clock is the system clock: a message stamped later saw every frame
        self.assertTrue(lst.wait_for(lambda r: any(a.header.stamp.sec + a.header.stamp.nanosec * 1e-9 > after
                                                   for a in r.diagnostics), 10))
        latest = rx.diagnostics[-1]
        names = {st.name for st in latest.status}
        self.assertLessEqual(DIAG_NAMES, names)
        self.assertEqual({st.hardware_id for st in latest.status}, {NODE})
        cache = {kv.key: kv.value for st in latest.status if st.name == "lingbot_map: kv cache" for kv in st.values}
        # every frame stored (keyframe_interval 1); 2 scale frames + a window of 3 keep all tokens, so the
        # 6th frame evicted the oldest window frame (it keeps only its special tokens)
        self.assertEqual((cache["frames_stored"], cache["window_frames"], cache["frames_evicted"]),
                         (str(FRAMES), "3", str(FRAMES - 2 - 3)))
        inference = {
            kv.key: kv.value for st in latest.status if st.name == "lingbot_map: inference" for kv in st.values
        }
        self.assertEqual(inference["frames_processed"], str(FRAMES))

    def test_3_diagnostics_aggregator_argument(self, proc_output) -> None:
        if not _aggregator_installed():
            # the launch file logs why on launch's own logger (not a process output): the caller,
            # test_launch_testing.py, checks that line in launch_test's output
            self.skipTest("diagnostic_aggregator is not installed")
        from diagnostic_msgs.msg import DiagnosticArray

        got = []
        self.listener.node.create_subscription(DiagnosticArray, "/diagnostics_agg", got.append, 10)
        deadline = time.monotonic() + 20
        wanted = {"/LingBot-Map/" + n.split(": ", 1)[1] for n in DIAG_NAMES}
        while time.monotonic() < deadline and not (got and wanted <= {s.name for s in got[-1].status}):
            time.sleep(0.2)
        self.assertTrue(got and wanted <= {s.name for s in got[-1].status}, "aggregated names missing")


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """After launch_testing's shutdown (SIGINT to every process)."""

    def test_every_process_exited_0(self, proc_info) -> None:
        launch_testing.asserts.assertExitCodes(proc_info)

    def test_node_stopped_cleanly(self, proc_output) -> None:
        text = "".join(io.text.decode(errors="replace") for io in proc_output)
        self.assertIn("[lingbot_map] stopped cleanly", text)
