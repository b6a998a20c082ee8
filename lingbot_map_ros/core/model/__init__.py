"""The LingBot-Map streaming model as ``nn.Module``s (keys identical to the official checkpoint).

No ROS, no KV-cache storage: global and camera attention are injected through the seams in
:mod:`.interfaces`.
"""
from .checkpoint import CheckpointError, LoadReport, apply_state_dict, build_model, load_state_dict_file
from .interfaces import CameraAttention, DenseCameraAttention, DenseGlobalAttention, GlobalAttention
from .lingbot_map import LingBotMap, ModelOutput

__all__ = [
    "LingBotMap",
    "ModelOutput",
    "build_model",
    "CheckpointError",
    "LoadReport",
    "apply_state_dict",
    "load_state_dict_file",
    "GlobalAttention",
    "CameraAttention",
    "DenseGlobalAttention",
    "DenseCameraAttention",
]
