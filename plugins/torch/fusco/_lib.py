"""ctypes binding of libfusco.so: the part of include/fusco.h that the plugin uses.

Nothing here compiles against torch, so one libfusco.so serves every torch version. The structs
mirror fusco.h field by field; the library checks size, magic and version of each on entry, so a
mismatch fails with a clear fuscoInvalidArgument instead of reading garbage.
"""
import ctypes
import ctypes.util
import os
import threading

# fuscoResult_t, by value (same values as NCCL's).
RESULT_NAMES = (
    "fuscoSuccess",
    "fuscoUnhandledCudaError",
    "fuscoSystemError",
    "fuscoInternalError",
    "fuscoInvalidArgument",
    "fuscoInvalidUsage",
    "fuscoRemoteError",
    "fuscoInProgress",
    "fuscoTimeout",
)
SUCCESS = 0
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5

# fuscoDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 6, 7, 8, 9

# fuscoMemType_t
MEM_HOST, MEM_CUDA = 0, 1

UNIQUE_ID_BYTES = 128
CONFIG_MAGIC = 0xF05C0C0F
CONFIG_VERSION = 2
MOE_CONFIG_MAGIC = 0xF05C0E0F
MOE_CONFIG_VERSION = 1

DEDUP = {"auto": 0, "none": 1, "rank": 2, "node": 3}
BALANCE = {"auto": 0, "none": 1, "static": 2, "greedy": 3}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """fuscoConfig_t; a new one holds FUSCO_CONFIG_INITIALIZER's values."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("memType", ctypes.c_int),
        ("cudaDevice", ctypes.c_int),
        ("timeoutMs", ctypes.c_int),
        ("localSize", ctypes.c_int),
        ("netDevices", ctypes.c_char_p),
        ("chunkBytes", ctypes.c_size_t),
        ("pipelineDepth", ctypes.c_int),
        ("maxSms", ctypes.c_int),
    ]

    def __init__(self):
        super().__init__(ctypes.sizeof(Config), CONFIG_MAGIC, CONFIG_VERSION, MEM_HOST, -1, 0, 0,
                         None, 0, 0, 0)


class MoeConfig(ctypes.Structure):
    """fuscoMoeConfig_t; a new one holds FUSCO_MOE_CONFIG_INITIALIZER's values."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("numExperts", ctypes.c_int),
        ("expertToRank", ctypes.POINTER(ctypes.c_int)),
        ("dedup", ctypes.c_int),
        ("balance", ctypes.c_int),
        ("expertAlignment", ctypes.c_int),
    ]

    def __init__(self):
        super().__init__(ctypes.sizeof(MoeConfig), MOE_CONFIG_MAGIC, MOE_CONFIG_VERSION, 0, None,
                         DEDUP["auto"], BALANCE["auto"], 0)


LL_CONFIG_MAGIC = 0xF05C011F
LL_CONFIG_VERSION = 1
LL_BF16 = 0
LL_FP8 = 1
LL_RECV_HOOK = 1


class LowLatencyConfig(ctypes.Structure):
    """fuscoLowLatencyConfig_t; a new one holds FUSCO_LOW_LATENCY_CONFIG_INITIALIZER's values."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("maxTokensPerRank", ctypes.c_int),
        ("hidden", ctypes.c_int),
        ("numExperts", ctypes.c_int),
        ("maxTopk", ctypes.c_int),
    ]

    def __init__(self):
        super().__init__(ctypes.sizeof(LowLatencyConfig), LL_CONFIG_MAGIC, LL_CONFIG_VERSION, 0,
                         0, 0, 0)


class LowLatencyDispatch(ctypes.Structure):
    """fuscoLowLatencyDispatch_t: where a low-latency dispatch's rows landed."""
    _fields_ = [
        ("buffer", ctypes.c_int),
        ("format", ctypes.c_int),
        ("hook", ctypes.c_ulonglong),
        ("recvX", ctypes.c_void_p),
        ("recvScales", ctypes.c_void_p),
        ("recvCount", ctypes.c_void_p),
        ("recvLayout", ctypes.c_void_p),
        ("recvSrcToken", ctypes.c_void_p),
    ]


_R = ctypes.c_int  # fuscoResult_t
_P = ctypes.c_void_p
_SZ = ctypes.c_size_t
_SIGNATURES = {
    "fuscoGetVersion": (_R, [ctypes.POINTER(ctypes.c_int)]),
    "fuscoGetErrorString": (ctypes.c_char_p, [_R]),
    "fuscoGetLastError": (ctypes.c_char_p, [_P]),
    "fuscoGetUniqueId": (_R, [ctypes.POINTER(UniqueId)]),
    "fuscoCommInitRankConfig": (_R, [ctypes.POINTER(_P), ctypes.c_int, UniqueId, ctypes.c_int,
                                     ctypes.POINTER(Config)]),
    "fuscoCommDestroy": (_R, [_P]),
    "fuscoCommAbort": (_R, [_P]),
    "fuscoCommCount": (_R, [_P, ctypes.POINTER(ctypes.c_int)]),
    "fuscoCommUserRank": (_R, [_P, ctypes.POINTER(ctypes.c_int)]),
    "fuscoCommNodeInfo": (_R, [_P] + [ctypes.POINTER(ctypes.c_int)] * 4),
    "fuscoCommGetAsyncError": (_R, [_P, ctypes.POINTER(_R)]),
    "fuscoGroupStart": (_R, []),
    "fuscoGroupEnd": (_R, []),
    "fuscoGatherSend": (_R, [_P, _P, _SZ, _SZ, ctypes.c_int, _P, _P]),
    "fuscoScatterRecv": (_R, [_P, _P, _SZ, _SZ, ctypes.c_int, _P, _P]),
    "fuscoMoePlan": (_R, [ctypes.POINTER(_P), _P, ctypes.POINTER(MoeConfig), _P, _SZ, ctypes.c_int,
                          _P]),
    "fuscoMoeReplan": (_R, [_P, _P, _SZ, ctypes.c_int, _P]),
    "fuscoMoeGetRecvCounts": (_R, [_P, ctypes.POINTER(_SZ), _P]),
    "fuscoMoeDispatch": (_R, [_P, _P, _SZ, _P, _P]),
    "fuscoMoeCombine": (_R, [_P, _P, ctypes.c_int, _SZ, _P, _P, _P]),
    "fuscoMoeHandleDestroy": (_R, [_P]),
    "fuscoLowLatencyCreate": (_R, [ctypes.POINTER(_P), _P, ctypes.POINTER(LowLatencyConfig)]),
    "fuscoLowLatencyDispatch": (_R, [_P, _P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_uint, ctypes.POINTER(LowLatencyDispatch), _P]),
    "fuscoLowLatencyCombine": (_R, [_P, ctypes.POINTER(LowLatencyDispatch), _P, _P, _P,
                                    ctypes.c_int, ctypes.c_int, _P, ctypes.c_uint,
                                    ctypes.POINTER(ctypes.c_ulonglong), _P]),
    "fuscoLowLatencyRecvHook": (_R, [_P, ctypes.c_ulonglong, _P]),
    "fuscoLowLatencyDestroy": (_R, [_P]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    """Where libfusco.so is looked for, in order (see the package docstring)."""
    env = os.environ.get("FUSCO_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for d in (here, os.path.dirname(here)):  # next to the package (a wheel or a copy)
        for name in ("libfusco.so", "libfusco.so.0"):
            found.append(os.path.join(d, name))
    # The build tree: this file is <repo>/plugins/torch/fusco/_lib.py, and the README builds
    # into <repo>/build.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    if os.path.exists(os.path.join(repo, "include", "fusco.h")):
        found.append(os.path.join(repo, "build", "libfusco.so"))
    return found


def load():
    """Returns the loaded library (once per process); raises OSError naming every place tried."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        path = None
        for c in _candidates():
            tried.append(c)
            if os.path.exists(c):
                path = c
                break
        if path is None and not os.environ.get("FUSCO_LIBRARY"):
            path = ctypes.util.find_library("fusco") or "libfusco.so.0"
            tried.append(path + " (system loader)")
        if path is None:
            raise OSError("fusco: FUSCO_LIBRARY=%s does not exist" % os.environ["FUSCO_LIBRARY"])
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError("fusco: cannot load libfusco.so (tried: %s; set FUSCO_LIBRARY to its "
                          "path): %s" % (", ".join(tried), e)) from None
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _lib, _lib_path = lib, path
        return lib


def library_path():
    """The path libfusco.so was loaded from (loads it if needed)."""
    load()
    return _lib_path
