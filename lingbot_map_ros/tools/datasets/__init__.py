"""Dataset readers for ``lingbot_map_benchmark``: one module per published layout, one interface
(``base.DatasetReader``: ``find`` the sequences, ``load`` one with its ground truth), each with the
official benchmark's protocol for that dataset (``base.Protocol``)."""
from __future__ import annotations

from . import droid_w, eth3d, euroc, kitti, nrgbd, oxford_spires, seven_scenes, tartanair, tnt, tum, vbr
from .base import DatasetError, DatasetReader, Protocol, Sequence

READERS: dict[str, DatasetReader] = {
    m.READER.name: m.READER
    for m in (tum, seven_scenes, eth3d, nrgbd, tnt, kitti, oxford_spires, vbr, droid_w, euroc, tartanair)
}

__all__ = ["DatasetError", "DatasetReader", "Protocol", "READERS", "Sequence"]
