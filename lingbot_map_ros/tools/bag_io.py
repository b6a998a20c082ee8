"""rosbag2 recordings (mcap and sqlite3) of camera images, read and written without ROS.

Reading goes through ``rosbags`` (pure Python) so ``lingbot_map_offline --bag`` and the tests run
on machines without DDS and without ``rosbag2_py`` (absent from the PyPI wheels, ROS_ENV.md).
Messages are deserialised into rosbags' dataclasses, which ``image_io.message_to_rgb`` reads like
rclpy messages (it only looks at the fields), so the offline path converts pixels exactly as the
node does. Nothing here imports rclpy.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

import numpy as np

from ..ros.image_io import message_to_rgb

IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_TYPE = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_TYPE)

PathLike = Union[str, os.PathLike]


class BagError(ValueError):
    """A bag that cannot serve images (missing, no image topic, ambiguous topic); says why."""


def _typestore():
    """The Jazzy message definitions (also what the node's messages are built from)."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def image_topics(path: PathLike) -> dict[str, str]:
    """``{topic: message type}`` of every Image/CompressedImage topic in the bag."""
    from rosbags.rosbag2 import Reader

    with Reader(_check_bag(path)) as reader:
        return {c.topic: c.msgtype for c in reader.connections if c.msgtype in IMAGE_TYPES}


def pick_image_topic(path: PathLike, topic: str = "") -> tuple[str, str]:
    """``(topic, msgtype)``: the requested image topic, or the only one when ``topic`` is empty.

    Guessing between several camera topics would silently reconstruct the wrong camera, so more
    than one candidate is an error that lists them.
    """
    topics = image_topics(path)
    if topic:
        if topic not in topics:
            listing = ", ".join(sorted(topics)) or "none"
            raise BagError(f"{path}: no Image/CompressedImage topic {topic!r} (image topics: {listing})")
        return topic, topics[topic]
    if not topics:
        raise BagError(f"{path}: no sensor_msgs/Image or sensor_msgs/CompressedImage topic in the bag")
    if len(topics) > 1:
        raise BagError(
            f"{path}: several image topics ({', '.join(sorted(topics))}); choose one with --topic"
        )
    return next(iter(topics.items()))


def _check_bag(path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise BagError(f"{p}: no such bag")
    if p.is_file():  # a bare .mcap/.db3: rosbags wants the folder holding metadata.yaml
        p = p.parent
    if not (p / "metadata.yaml").exists():
        raise BagError(f"{p}: not a rosbag2 folder (no metadata.yaml)")
    return p


def stamp_seconds(header) -> float:
    """Header stamp as float seconds (the key TUM files and the node's trajectory use)."""
    return int(header.stamp.sec) + int(header.stamp.nanosec) * 1e-9


def iter_bag_messages(path: PathLike, topic: str = "") -> Iterator[tuple[str, bytes, int]]:
    """Raw CDR messages of one image topic: ``(msgtype, raw bytes, receive time ns)``, in bag order.

    The replay tool publishes these bytes unchanged (no per-field conversion).
    """
    from rosbags.rosbag2 import Reader

    chosen, _ = pick_image_topic(path, topic)
    with Reader(_check_bag(path)) as reader:
        connections = [c for c in reader.connections if c.topic == chosen]
        for conn, t_ns, raw in reader.messages(connections=connections):
            yield conn.msgtype, bytes(raw), int(t_ns)


def iter_bag_images(path: PathLike, topic: str = "") -> Iterator[tuple[np.ndarray, float]]:
    """``(rgb uint8 [H, W, 3], header stamp in seconds)`` for every image of one topic.

    Undecodable frames raise ``image_io.UnsupportedImage`` with the reason (an offline run should
    not quietly skip frames it was asked to reconstruct).
    """
    store = _typestore()
    for msgtype, raw, _ in iter_bag_messages(path, topic):
        msg = store.deserialize_cdr(raw, msgtype)
        yield message_to_rgb(msg), stamp_seconds(msg.header)


def _split_stamp(stamp: float) -> tuple[int, int]:
    ns = int(round(float(stamp) * 1e9))
    return ns // 1_000_000_000, ns % 1_000_000_000


def write_image_bag(
    path: PathLike,
    frames: Iterable[np.ndarray],
    stamps: Sequence[float],
    storage: str = "mcap",
    topic: str = "/camera/image_raw",
    compressed: bool = False,
    frame_id: str = "camera_optical",
    encoding: str = "rgb8",
) -> Path:
    """Write RGB uint8 frames ``[H, W, 3]`` as a rosbag2 recording (tests, the demo).

    ``compressed`` stores PNG ``CompressedImage`` messages (lossless, so a test can compare pixels);
    else raw ``Image`` in ``encoding`` (``rgb8`` or ``bgr8``). The receive time of each message is its
    header stamp, so "recorded rate" replay reproduces the stamps' spacing.
    """
    import cv2
    from rosbags.rosbag2 import StoragePlugin, Writer

    plugins = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
    if storage not in plugins:
        raise ValueError(f"storage must be 'mcap' or 'sqlite3' (got {storage!r})")
    if encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"encoding must be 'rgb8' or 'bgr8' (got {encoding!r})")
    out = Path(path)
    if out.exists():
        raise BagError(f"{out} exists; rosbag2 writers never overwrite")
    store = _typestore()
    header_t = store.types["std_msgs/msg/Header"]
    time_t = store.types["builtin_interfaces/msg/Time"]
    msgtype = COMPRESSED_TYPE if compressed else IMAGE_TYPE
    msg_t = store.types[msgtype]
    frames, stamps = list(frames), list(stamps)
    if len(frames) != len(stamps):
        raise ValueError(f"{len(frames)} frames but {len(stamps)} stamps")
    with Writer(out, version=9, storage_plugin=plugins[storage]) as writer:
        conn = writer.add_connection(topic, msgtype, typestore=store)
        for rgb, stamp in zip(frames, stamps):
            rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
            if rgb.ndim != 3 or rgb.shape[2] != 3:
                raise ValueError(f"frames must be [H, W, 3] uint8, got {rgb.shape}")
            sec, nsec = _split_stamp(stamp)
            header = header_t(stamp=time_t(sec=sec, nanosec=nsec), frame_id=frame_id)
            if compressed:
                ok, png = cv2.imencode(".png", rgb[:, :, ::-1])
                if not ok:
                    raise ValueError("PNG encoding failed")
                msg = msg_t(header=header, format="png", data=png.reshape(-1))
            else:
                pixels = rgb if encoding == "rgb8" else np.ascontiguousarray(rgb[:, :, ::-1])
                h, w = rgb.shape[:2]
                msg = msg_t(header=header, height=h, width=w, encoding=encoding, is_bigendian=0,
                            step=w * 3, data=pixels.reshape(-1))
            writer.write(conn, sec * 1_000_000_000 + nsec, store.serialize_cdr(msg, msgtype))
    return out


__all__ = [
    "BagError",
    "COMPRESSED_TYPE",
    "IMAGE_TYPE",
    "image_topics",
    "iter_bag_images",
    "iter_bag_messages",
    "pick_image_topic",
    "stamp_seconds",
    "write_image_bag",
]
