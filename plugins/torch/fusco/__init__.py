"""fusco for PyTorch: communicators, a Megatron-compatible MoE dispatcher with autograd, and the
layout-level all-to-all, over libfusco.so through ctypes (no compiled extension, so one build of
the library serves every torch version).

libfusco.so is found through, in order: the FUSCO_LIBRARY environment variable (a path); a
libfusco.so next to this package (inside it or in its parent folder); the repository's build tree
(build/libfusco.so beside plugins/, when the package is used from a checkout); the system loader
(ctypes.util.find_library("fusco"), e.g. after `cmake --install` into a prefix that ld.so knows).

CPU tensors go with host communicators (stream NULL); CUDA tensors with a communicator made with
device="cuda" (fuscoMemCuda on torch's current device), ordered on torch's current CUDA stream.
"""
from ._lib import library_path
from .comm import Communicator, FuscoError, get_unique_id, get_version
from .dispatcher import MoEDispatcher, Route
from .layout import all_to_all, get_default_communicator, set_default_communicator

__all__ = [
    "Communicator",
    "FuscoError",
    "MoEDispatcher",
    "Route",
    "all_to_all",
    "get_default_communicator",
    "get_unique_id",
    "get_version",
    "library_path",
    "set_default_communicator",
]
