"""Camera-image recordings - rosbag2 folders (mcap, sqlite3) and ROS 1 ``.bag`` files - without ROS.

Reading goes through ``rosbags`` (pure Python, ``rosbags.highlevel.AnyReader`` for both formats) so
``lingbot_map_offline --bag`` and ``lingbot_map_replay`` run on machines without DDS and without
``rosbag2_py`` (absent from the PyPI wheels), and take the ROS 1 recordings many teams still hold.
Messages are deserialised into rosbags' dataclasses, which ``image_io.message_to_rgb`` reads like
rclpy messages (it only looks at the fields), so the offline path converts pixels exactly as the
node does. The replay tool needs ROS 2 CDR bytes: rosbag2 messages are passed on unchanged, ROS 1
ones are rebuilt field by field as Jazzy messages (ROS 1's ``Header.seq`` has no ROS 2 field).
Nothing here imports rclpy.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from ..ros.image_io import message_to_rgb

IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_TYPE = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_TYPE)
STORAGES = ("mcap", "sqlite3", "ros1")  # what write_image_bag writes

PathLike = Union[str, os.PathLike]


class BagError(ValueError):
    """A bag that cannot serve images (missing, no image topic, ambiguous topic); says why."""


def _typestore():
    """The Jazzy message definitions (also what the node's messages are built from)."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def bag_kind(path: PathLike) -> tuple[str, Path]:
    """``("ros1", file)`` or ``("rosbag2", folder)`` for a recording, else ``BagError`` saying what it is."""
    p = Path(path).expanduser()
    if not p.exists():
        raise BagError(f"{p}: no such bag (give a rosbag2 folder or a ROS 1 .bag file)")
    if p.is_file():
        if p.suffix == ".bag":
            return "ros1", p
        if p.suffix in (".mcap", ".db3"):  # a bare storage file: rosbags wants the folder holding metadata.yaml
            p = p.parent
        else:
            raise BagError(f"{p}: not a bag (a ROS 1 .bag file or a rosbag2 folder with metadata.yaml)")
    if not (p / "metadata.yaml").exists():
        raise BagError(f"{p}: not a rosbag2 folder (no metadata.yaml) nor a ROS 1 .bag file")
    return "rosbag2", p


def _check_bag(path: PathLike) -> Path:
    return bag_kind(path)[1]


def _open(path: PathLike):
    """An opened-to-be ``AnyReader`` (use as a context manager); unreadable files become ``BagError``."""
    from rosbags.highlevel import AnyReader

    kind, p = bag_kind(path)
    return AnyReader([p], default_typestore=_typestore())


class _Opened:
    """``with _Opened(path) as reader``: AnyReader whose open errors (truncated, not a bag) say the file."""

    def __init__(self, path: PathLike) -> None:
        self.path = path
        self.reader = _open(path)

    def __enter__(self):
        try:
            self.reader.open()
        except Exception as exc:  # noqa: BLE001 - rosbags raises its own error types per format
            raise BagError(f"{self.path}: cannot read the bag ({type(exc).__name__}: {exc})") from exc
        return self.reader

    def __exit__(self, *exc) -> None:
        self.reader.close()


def image_topics(path: PathLike) -> dict[str, str]:
    """``{topic: message type}`` of every Image/CompressedImage topic in the bag."""
    with _Opened(path) as reader:
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
            raise BagError(f"{path}: no Image/CompressedImage topic {topic!r} (image topics: {listing}); "
                           "choose one with --topic")
        return topic, topics[topic]
    if not topics:
        raise BagError(f"{path}: no sensor_msgs/Image or sensor_msgs/CompressedImage topic in the bag")
    if len(topics) > 1:
        raise BagError(
            f"{path}: several image topics ({', '.join(sorted(topics))}); choose one with --topic"
        )
    return next(iter(topics.items()))


def message_count(path: PathLike, topic: str) -> int:
    """Messages recorded on ``topic`` (for progress bars; 0 when the index does not say)."""
    with _Opened(path) as reader:
        return sum(int(getattr(c, "msgcount", 0) or 0) for c in reader.connections if c.topic == topic)


def stamp_seconds(header) -> float:
    """Header stamp as float seconds (the key TUM files and the node's trajectory use)."""
    return int(header.stamp.sec) + int(header.stamp.nanosec) * 1e-9


class HeaderStamp(float):
    """A header stamp as float seconds that keeps its exact nanoseconds (``ns``): a TF lookup at a
    recording's stamp must hit the recorded transforms exactly, not 100 ns past the last one."""

    ns: int

    def __new__(cls, header) -> "HeaderStamp":
        obj = super().__new__(cls, stamp_seconds(header))
        obj.ns = int(header.stamp.sec) * 10**9 + int(header.stamp.nanosec)
        return obj


def iter_bag_decoded(path: PathLike, topic: str = "") -> Iterator[tuple[str, Any, Optional[bytes], int]]:
    """``(msgtype, message, CDR bytes or None, receive time ns)`` of one image topic, in bag order.

    The CDR bytes are the recorded ones for rosbag2 and None for ROS 1 (``to_cdr`` rebuilds them).
    """
    chosen, _ = pick_image_topic(path, topic)
    kind, _ = bag_kind(path)
    with _Opened(path) as reader:
        connections = [c for c in reader.connections if c.topic == chosen]
        for conn, t_ns, raw in reader.messages(connections=connections):
            msg = reader.deserialize(raw, conn.msgtype)
            yield conn.msgtype, msg, (bytes(raw) if kind == "rosbag2" else None), int(t_ns)


def to_cdr(msg: Any, msgtype: str, store=None) -> bytes:
    """A ROS 1 (or any field-compatible) Image/CompressedImage as Jazzy CDR bytes, field by field."""
    store = store or _typestore()
    time_t = store.types["builtin_interfaces/msg/Time"]
    header = store.types["std_msgs/msg/Header"](
        stamp=time_t(sec=int(msg.header.stamp.sec), nanosec=int(msg.header.stamp.nanosec)),
        frame_id=str(msg.header.frame_id))
    data = np.asarray(msg.data, dtype=np.uint8).reshape(-1)
    if msgtype == COMPRESSED_TYPE:
        out = store.types[msgtype](header=header, format=str(msg.format), data=data)
    else:
        out = store.types[msgtype](header=header, height=int(msg.height), width=int(msg.width),
                                   encoding=str(msg.encoding), is_bigendian=int(msg.is_bigendian),
                                   step=int(msg.step), data=data)
    return bytes(store.serialize_cdr(out, msgtype))


def iter_bag_messages(path: PathLike, topic: str = "") -> Iterator[tuple[str, bytes, int]]:
    """CDR messages of one image topic: ``(msgtype, CDR bytes, receive time ns)``, in bag order.

    The replay tool publishes these bytes (rosbag2: unchanged; ROS 1: rebuilt as Jazzy messages).
    """
    store = _typestore()
    for msgtype, msg, raw, t_ns in iter_bag_decoded(path, topic):
        yield msgtype, (raw if raw is not None else to_cdr(msg, msgtype, store)), t_ns


def iter_bag_images(path: PathLike, topic: str = "") -> Iterator[tuple[np.ndarray, float]]:
    """``(rgb uint8 [H, W, 3], header stamp in seconds)`` for every image of one topic.

    Undecodable frames raise ``image_io.UnsupportedImage`` with the reason (an offline run should
    not quietly skip frames it was asked to reconstruct).
    """
    for _, msg, _, _ in iter_bag_decoded(path, topic):
        yield message_to_rgb(msg), HeaderStamp(msg.header)


def iter_bag_images_of(path: PathLike, topics: Sequence[str]) -> Iterator[tuple[str, np.ndarray, "HeaderStamp"]]:
    """``(topic, rgb uint8 [H, W, 3], header stamp)`` of several image topics (several cameras of one
    recording), merged in the bag's order (receive time), as a node subscribed to all of them hears them.
    Undecodable frames raise ``image_io.UnsupportedImage``, as ``iter_bag_images``."""
    chosen = {pick_image_topic(path, t)[0] for t in topics}
    with _Opened(path) as reader:
        connections = [c for c in reader.connections if c.topic in chosen]
        for conn, _, raw in reader.messages(connections=connections):
            msg = reader.deserialize(raw, conn.msgtype)
            yield conn.topic, message_to_rgb(msg), HeaderStamp(msg.header)


def check_first_image(path: PathLike, topic: str = "") -> tuple[str, str, int]:
    """Decode the first image of the topic before any work: ``(topic, msgtype, message count)``.

    A depth topic or an unsupported encoding is then refused at once, naming the bag and the topic,
    instead of after the model was built (or, for replay, by the node, frame after frame).
    """
    from ..ros.image_io import UnsupportedImage

    chosen, msgtype = pick_image_topic(path, topic)
    for _, msg, _, _ in iter_bag_decoded(path, chosen):
        try:
            message_to_rgb(msg)
        except UnsupportedImage as exc:
            raise BagError(f"{path}: topic {chosen}: {exc}; choose a camera topic with --topic") from None
        break
    else:
        raise BagError(f"{path}: topic {chosen} has no messages")
    return chosen, msgtype, message_count(path, chosen)


# ------------------------------------------------------------------------------------ a robot's recording
TF_TYPE = "tf2_msgs/msg/TFMessage"
TF_TOPICS = ("/tf", "/tf_static")
# at one stamp the robot's transforms and the depth image go out before the colour image, so the node
# has all a frame needs when the frame arrives (as a live robot's odometry and depth usually do)
KIND_ORDER = {"tf_static": 0, "tf": 1, "depth": 2, "image": 3}


def tf_topics(path: PathLike) -> list[str]:
    """The bag's ``/tf`` and ``/tf_static`` topics (TFMessage), in that order."""
    with _Opened(path) as reader:
        found = {c.topic for c in reader.connections if c.msgtype in (TF_TYPE, "tf/msg/tfMessage")}
    return [t for t in TF_TOPICS if t in found]


def pick_depth_topic(path: PathLike, topic: str) -> tuple[str, str]:
    """``(topic, msgtype)`` of a depth topic (Image 16UC1/32FC1 or compressedDepth), else ``BagError``."""
    topics = image_topics(path)
    if topic not in topics:
        raise BagError(f"{path}: no depth topic {topic!r} (image topics: {', '.join(sorted(topics)) or 'none'}); "
                       "choose one with --depth-topic")
    return topic, topics[topic]


def to_ros2(msg: Any, msgtype: str, store=None) -> Any:
    """A ROS 1 message (rosbags' dataclass) as the Jazzy one of the same type, field by field (``Header.seq``
    and any other field Jazzy lacks are left out; nested messages and arrays of them converted too)."""
    store = store or _typestore()
    cls = store.types[msgtype]
    fields = {}
    for name in cls.__dataclass_fields__:
        if name == "__msgtype__":
            continue
        value = getattr(msg, name)
        fields[name] = _convert(value, store)
    return cls(**fields)


def _convert(value: Any, store) -> Any:
    if hasattr(value, "__msgtype__"):
        return to_ros2(value, value.__msgtype__, store)
    if isinstance(value, list):
        return [_convert(v, store) for v in value]
    return value


def message_cdr(msg: Any, msgtype: str, raw: Optional[bytes], store=None) -> bytes:
    """Jazzy CDR bytes of a bag message: rosbag2's recorded bytes, or a ROS 1 message rebuilt."""
    if raw is not None:
        return raw
    store = store or _typestore()
    if msgtype == "tf/msg/tfMessage":  # ROS 1's old tf name of the same message
        msgtype = TF_TYPE
    return bytes(store.serialize_cdr(to_ros2(msg, msgtype, store), msgtype))


def bag_recording_info(path: PathLike, topic: str = "") -> tuple[str, tuple[int, int], float]:
    """The colour topic's ``(frame_id, (width, height), duration s)``: the camera frame, the size the depth
    is registered to, and how long the TF tree must keep transforms."""
    chosen, _ = pick_image_topic(path, topic)
    for _, msg, _, _ in iter_bag_decoded(path, chosen):
        rgb = message_to_rgb(msg)
        frame_id, wh = str(msg.header.frame_id), (int(rgb.shape[1]), int(rgb.shape[0]))
        break
    else:
        raise BagError(f"{path}: topic {chosen} has no messages")
    with _Opened(path) as reader:
        duration = max(0.0, (int(reader.end_time) - int(reader.start_time)) * 1e-9)
    return frame_id, wh, duration


def _sort_stamp(kind: str, msg: Any) -> int:
    if kind == "tf_static":
        return -1
    if kind == "tf":
        return max((int(t.header.stamp.sec) * 10**9 + int(t.header.stamp.nanosec) for t in msg.transforms), default=0)
    return int(msg.header.stamp.sec) * 10**9 + int(msg.header.stamp.nanosec)


def iter_robot_messages(path: PathLike, topics: dict[str, str], window: int = 64
                        ) -> Iterator[tuple[str, str, str, Any, Optional[bytes], int]]:
    """``(kind, topic, msgtype, message, rosbag2 CDR bytes or None, stamp ns)`` of ``topics`` (topic -> kind:
    image, depth, tf, tf_static) in stamp order (``KIND_ORDER`` at equal stamps), sorted within a window of
    ``window`` messages (a recording is nearly in stamp order already). A TF message's stamp is its newest
    transform's; /tf_static comes first."""
    import heapq

    kind_of = dict(topics)
    ros1 = bag_kind(path)[0] == "ros1"
    heap: list = []
    seq = 0
    with _Opened(path) as reader:
        connections = [c for c in reader.connections if c.topic in kind_of]
        for conn, _, raw in reader.messages(connections=connections):
            msg = reader.deserialize(raw, conn.msgtype)
            kind = kind_of[conn.topic]
            stamp = _sort_stamp(kind, msg)
            heapq.heappush(heap, (stamp, KIND_ORDER[kind], seq, kind, conn.topic, conn.msgtype, msg,
                                  None if ros1 else bytes(raw)))
            seq += 1
            if len(heap) > window:
                item = heapq.heappop(heap)
                yield item[3], item[4], item[5], item[6], item[7], item[0]
        while heap:
            item = heapq.heappop(heap)
            yield item[3], item[4], item[5], item[6], item[7], item[0]


def write_robot_bag(path: PathLike, topics: dict[str, str], items: Iterable[tuple[str, int, Any]],
                    storage: str = "mcap") -> Path:
    """A robot recording for tests: ``topics`` topic -> Jazzy msgtype, ``items`` (topic, receive time ns,
    a Jazzy message built with ``bag_typestore()``). rosbag2 only (``mcap``/``sqlite3``)."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    out = Path(path)
    if out.exists():
        raise BagError(f"{out} exists; bag writers never overwrite")
    store = _typestore()
    plugins = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
    with Writer(out, version=9, storage_plugin=plugins[storage]) as writer:
        conns = {t: writer.add_connection(t, m, typestore=store) for t, m in topics.items()}
        for topic, t_ns, msg in items:
            writer.write(conns[topic], int(t_ns), store.serialize_cdr(msg, topics[topic]))
    return out


def bag_typestore():
    """The Jazzy message classes a test builds a robot recording from."""
    return _typestore()


def _split_stamp(stamp: float) -> tuple[int, int]:
    ns = int(round(float(stamp) * 1e9))
    return ns // 1_000_000_000, ns % 1_000_000_000


def image_fields(pixels: np.ndarray, encoding: str = "rgb8") -> dict:
    """Fields of a raw ``sensor_msgs/Image`` holding ``pixels`` (RGB [H, W, 3] uint8 for rgb8/bgr8,
    [H, W] uint8 for mono8, [H, W] uint16 for 16UC1/mono16, [H, W] float32 for 32FC1, little endian)."""
    a = np.asarray(pixels)
    if encoding in ("rgb8", "bgr8"):
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"{encoding} frames must be [H, W, 3] uint8, got {a.dtype} {a.shape}")
        a = a if encoding == "rgb8" else a[:, :, ::-1]
    elif encoding == "mono8":
        if a.dtype != np.uint8 or a.ndim != 2:
            raise ValueError(f"mono8 frames must be [H, W] uint8, got {a.dtype} {a.shape}")
    elif encoding in ("16UC1", "mono16"):
        if a.dtype != np.uint16 or a.ndim != 2:
            raise ValueError(f"{encoding} frames must be [H, W] uint16, got {a.dtype} {a.shape}")
        a = a.astype("<u2")
    elif encoding == "32FC1":  # a depth image in metres
        if a.dtype != np.float32 or a.ndim != 2:
            raise ValueError(f"32FC1 frames must be [H, W] float32, got {a.dtype} {a.shape}")
        a = a.astype("<f4")
    else:
        raise ValueError(f"encoding must be rgb8, bgr8, mono8, 16UC1, mono16 or 32FC1 (got {encoding!r})")
    a = np.ascontiguousarray(a)
    h, w = a.shape[:2]
    return dict(height=h, width=w, encoding=encoding, is_bigendian=0, step=a.nbytes // h,
                data=a.view(np.uint8).reshape(-1))


def compressed_fields(pixels: np.ndarray, codec: str = "png", fmt: str = "") -> dict:
    """Fields of a ``sensor_msgs/CompressedImage``: RGB uint8 [H, W, 3] as PNG/JPEG, or a uint16
    [H, W] depth image as 16-bit PNG. ``fmt`` overrides the ``format`` string (image_transport's
    ``"rgb8; jpeg compressed bgr8"``, ``"16UC1; png compressed"``, ``"16UC1; compressedDepth png"``)."""
    import cv2

    a = np.asarray(pixels)
    ext = {"png": ".png", "jpeg": ".jpg"}.get(codec)
    if ext is None:
        raise ValueError(f"codec must be 'png' or 'jpeg' (got {codec!r})")
    if a.dtype == np.uint16 and a.ndim == 2:
        if codec != "png":
            raise ValueError("16-bit images compress as PNG only")
        ok, buf = cv2.imencode(".png", a)
        default_fmt = "16UC1; png compressed"
    else:
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"colour frames must be [H, W, 3] uint8, got {a.dtype} {a.shape}")
        ok, buf = cv2.imencode(ext, np.ascontiguousarray(a[:, :, ::-1]))
        default_fmt = codec if codec == "png" else f"rgb8; {codec} compressed bgr8"
    if not ok:
        raise ValueError(f"{codec} encoding failed")
    data = buf.reshape(-1)
    if "compresseddepth" in (fmt or "").lower():
        # compressed_depth_image_transport: a 12-byte config header (format enum + 2 floats) before the PNG
        data = np.concatenate([np.zeros(12, np.uint8), data])
    return dict(format=fmt or default_fmt, data=data)


def write_messages_bag(path: PathLike, topic: str, msgtype: str, items: Iterable[tuple[float, dict]],
                       storage: str = "mcap", frame_id: str = "camera_optical") -> Path:
    """Write ``(stamp seconds, message fields without header)`` as Image/CompressedImage messages.

    ``storage``: ``mcap`` or ``sqlite3`` (a rosbag2 folder) or ``ros1`` (a ROS 1 ``.bag`` file, with
    the ROS 1 definitions, ``Header.seq`` counting up). The receive time of each message is its
    header stamp, so "recorded rate" replay reproduces the stamps' spacing.
    """
    from rosbags.typesys import Stores, get_typestore

    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {', '.join(STORAGES)} (got {storage!r})")
    if msgtype not in IMAGE_TYPES:
        raise ValueError(f"msgtype must be one of {', '.join(IMAGE_TYPES)} (got {msgtype!r})")
    out = Path(path)
    if out.exists():
        raise BagError(f"{out} exists; bag writers never overwrite")
    ros1 = storage == "ros1"
    if ros1 and out.suffix != ".bag":
        raise ValueError(f"a ROS 1 bag needs a .bag name (got {out.name})")
    store = get_typestore(Stores.ROS1_NOETIC) if ros1 else _typestore()
    header_t = store.types["std_msgs/msg/Header"]
    time_t = store.types["builtin_interfaces/msg/Time"]
    msg_t = store.types[msgtype]
    if ros1:
        from rosbags.rosbag1 import Writer as Ros1Writer

        writer_cm = Ros1Writer(out)
    else:
        from rosbags.rosbag2 import StoragePlugin, Writer

        plugins = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
        writer_cm = Writer(out, version=9, storage_plugin=plugins[storage])
    with writer_cm as writer:
        conn = writer.add_connection(topic, msgtype, typestore=store)
        for seq, (stamp, fields) in enumerate(items):
            sec, nsec = _split_stamp(stamp)
            stamp_msg = time_t(sec=sec, nanosec=nsec)
            header = header_t(seq=seq, stamp=stamp_msg, frame_id=frame_id) if ros1 else \
                header_t(stamp=stamp_msg, frame_id=frame_id)
            msg = msg_t(header=header, **fields)
            raw = store.serialize_ros1(msg, msgtype) if ros1 else store.serialize_cdr(msg, msgtype)
            writer.write(conn, sec * 1_000_000_000 + nsec, raw)
    return out


def write_image_bag(
    path: PathLike,
    frames: Iterable[np.ndarray],
    stamps: Sequence[float],
    storage: str = "mcap",
    topic: str = "/camera/image_raw",
    compressed: Union[bool, str] = False,
    frame_id: str = "camera_optical",
    encoding: str = "rgb8",
    compressed_format: str = "",
) -> Path:
    """Write frames as a recording (tests, the demo): rosbag2 (``mcap``/``sqlite3``) or ROS 1 (``ros1``).

    ``compressed``: False for raw ``Image`` in ``encoding`` (rgb8/bgr8 from RGB [H, W, 3] uint8,
    mono8 from [H, W] uint8, 16UC1/mono16 from [H, W] uint16); True or ``"png"`` for PNG
    ``CompressedImage`` (lossless, so a test can compare pixels; 16-bit PNG for uint16 frames);
    ``"jpeg"`` for JPEG. ``compressed_format`` overrides the message's ``format`` string.
    """
    frames, stamps = list(frames), list(stamps)
    if len(frames) != len(stamps):
        raise ValueError(f"{len(frames)} frames but {len(stamps)} stamps")
    if compressed:
        codec = "png" if compressed is True else str(compressed)
        items = [(s, compressed_fields(f, codec, compressed_format)) for f, s in zip(frames, stamps)]
        msgtype = COMPRESSED_TYPE
    else:
        items = [(s, image_fields(f, encoding)) for f, s in zip(frames, stamps)]
        msgtype = IMAGE_TYPE
    return write_messages_bag(path, topic, msgtype, items, storage=storage, frame_id=frame_id)


def write_cameras_bag(path: PathLike, cameras: dict[str, tuple[Sequence[np.ndarray], Sequence[float]]],
                      storage: str = "mcap") -> Path:
    """A recording of several cameras (tests): ``cameras`` topic -> (RGB uint8 frames [H, W, 3], header
    stamps in s), raw rgb8 ``Image`` messages received at their stamps, frame_id ``<topic>_optical``.
    rosbag2 only (``mcap``/``sqlite3``)."""
    store = _typestore()
    header_t, time_t, image_t = (store.types[t] for t in ("std_msgs/msg/Header", "builtin_interfaces/msg/Time",
                                                          IMAGE_TYPE))
    items = []
    for topic, (frames, stamps) in cameras.items():
        frames, stamps = list(frames), list(stamps)
        if len(frames) != len(stamps):
            raise ValueError(f"{topic}: {len(frames)} frames but {len(stamps)} stamps")
        frame_id = topic.strip("/").replace("/", "_") + "_optical"
        for frame, stamp in zip(frames, stamps):
            sec, nsec = _split_stamp(stamp)
            header = header_t(stamp=time_t(sec=sec, nanosec=nsec), frame_id=frame_id)
            items.append((topic, sec * 1_000_000_000 + nsec, image_t(header=header, **image_fields(frame))))
    items.sort(key=lambda item: item[1])
    return write_robot_bag(path, {t: IMAGE_TYPE for t in cameras}, items, storage=storage)


__all__ = [
    "BagError",
    "HeaderStamp",
    "KIND_ORDER",
    "TF_TYPE",
    "bag_recording_info",
    "bag_typestore",
    "iter_bag_images_of",
    "iter_robot_messages",
    "message_cdr",
    "pick_depth_topic",
    "write_cameras_bag",
    "tf_topics",
    "to_ros2",
    "write_robot_bag",
    "STORAGES",
    "bag_kind",
    "check_first_image",
    "compressed_fields",
    "image_fields",
    "iter_bag_decoded",
    "message_count",
    "to_cdr",
    "write_messages_bag",
    "COMPRESSED_TYPE",
    "IMAGE_TYPE",
    "image_topics",
    "iter_bag_images",
    "iter_bag_messages",
    "pick_image_topic",
    "stamp_seconds",
    "write_image_bag",
]
