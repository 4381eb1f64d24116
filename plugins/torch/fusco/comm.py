"""Communicators and errors."""
import ctypes
import weakref

import torch

from . import _lib


class FuscoError(RuntimeError):
    """A fusco call failed. `result` is the fuscoResult_t value, `result_name` its enum name
    (e.g. "fuscoInvalidArgument"), `message` fusco's fuscoGetLastError text (or the plugin's own
    message for an argument the plugin rejected before calling the library)."""

    def __init__(self, result, message):
        self.result = int(result)
        if 0 <= self.result < len(_lib.RESULT_NAMES):
            self.result_name = _lib.RESULT_NAMES[self.result]
        else:
            self.result_name = "fuscoResult(%d)" % self.result
        self.message = message
        super().__init__("%s: %s" % (self.result_name, message))


def check(result, comm=None, what=""):
    """Raises FuscoError for a failed result, with the comm's (else the thread's) last error."""
    if result == _lib.SUCCESS:
        return
    lib = _lib.load()
    msg = b""
    if comm is not None:
        msg = lib.fuscoGetLastError(comm) or b""
    if not msg:
        msg = lib.fuscoGetLastError(None) or b""
    msg = msg.decode("utf-8", "replace")
    if not msg:
        msg = (lib.fuscoGetErrorString(result) or b"").decode()
    if what and what not in msg:
        msg = "%s: %s" % (what, msg)
    raise FuscoError(result, msg)


def invalid(message):
    """The error the plugin raises for arguments it rejects itself."""
    return FuscoError(_lib.INVALID_ARGUMENT, message)


def get_version():
    """(major, minor, patch) of the loaded libfusco.so."""
    v = ctypes.c_int()
    check(_lib.load().fuscoGetVersion(ctypes.byref(v)))
    return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def get_unique_id():
    """A fresh fuscoUniqueId as 128 bytes. The process that calls this must be rank 0 of the
    communicator made from it (or its parent, forking after the call)."""
    uid = _lib.UniqueId()
    check(_lib.load().fuscoGetUniqueId(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES)


def _resolve_device(device):
    if device is None:
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        if not torch.cuda.is_available():
            raise invalid("fusco: a CUDA communicator was asked for, but torch sees no CUDA "
                          "device")
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise invalid("fusco: device %s is neither cpu nor cuda" % device)
    return device


class Communicator:
    """A fusco communicator of `nranks` processes, this one being `rank`.

    device: "cpu" (default; a host-memory comm, every call synchronous, stream NULL) or "cuda" /
    torch.device("cuda", i) (a fuscoMemCuda comm on that device, default the current one; calls
    are ordered on torch's current CUDA stream). Tensors passed to the comm must live there.
    timeout_ms, local_size, net_devices, chunk_bytes, pipeline_depth, max_sms: fuscoConfig_t's
    fields (0 / None: the library's default or the FUSCO_* environment variable); max_sms is the
    SM budget of a CUDA comm's kernels.

    Use as a context manager, or call destroy(); the comm is also destroyed when collected.
    """

    def __init__(self, nranks, rank, unique_id, device=None, *, timeout_ms=0, local_size=0,
                 net_devices=None, chunk_bytes=0, pipeline_depth=0, max_sms=0):
        self._lib = _lib.load()
        self._handle = None
        self._children = weakref.WeakSet()
        self.device = _resolve_device(device)
        if isinstance(unique_id, torch.Tensor):
            unique_id = bytes(unique_id.cpu().to(torch.uint8).tolist())
        unique_id = bytes(unique_id)
        if len(unique_id) != _lib.UNIQUE_ID_BYTES:
            raise invalid("fusco: a unique id has %d bytes, got %d" % (_lib.UNIQUE_ID_BYTES,
                                                                      len(unique_id)))
        cfg = _lib.Config()
        cfg.memType = _lib.MEM_CUDA if self.device.type == "cuda" else _lib.MEM_HOST
        cfg.cudaDevice = self.device.index if self.device.type == "cuda" else -1
        cfg.timeoutMs = int(timeout_ms)
        cfg.localSize = int(local_size)
        self._net_devices = net_devices.encode() if net_devices else None  # kept alive
        cfg.netDevices = self._net_devices
        cfg.chunkBytes = int(chunk_bytes)
        cfg.pipelineDepth = int(pipeline_depth)
        cfg.maxSms = int(max_sms)
        uid = _lib.UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, _lib.UNIQUE_ID_BYTES)
        h = ctypes.c_void_p()
        check(self._lib.fuscoCommInitRankConfig(ctypes.byref(h), int(nranks), uid, int(rank),
                                                ctypes.byref(cfg)), None, "fuscoCommInitRank")
        self._handle = h
        self.nranks = int(nranks)
        self.rank = int(rank)

    @classmethod
    def from_process_group(cls, group=None, device=None, **config):
        """A comm over the ranks of a torch.distributed group (default: the world), in the group's
        rank order. Rank 0 of the group makes the unique id; it reaches the others by a broadcast
        of a uint8 tensor over the group (collective over the group). device defaults to the
        current CUDA device for an NCCL group and to "cpu" otherwise."""
        import torch.distributed as dist

        if group is None:
            group = dist.group.WORLD
        nranks = dist.get_world_size(group)
        rank = dist.get_rank(group)
        backend = dist.get_backend(group)
        if device is None:
            device = "cuda" if backend == "nccl" else "cpu"
        bcast_device = torch.device("cuda", torch.cuda.current_device()) \
            if backend == "nccl" else torch.device("cpu")
        buf = torch.zeros(_lib.UNIQUE_ID_BYTES, dtype=torch.uint8)
        if rank == 0:
            buf = torch.tensor(list(get_unique_id()), dtype=torch.uint8)
        buf = buf.to(bcast_device)
        root = 0
        if group is not dist.group.WORLD:
            global_rank = getattr(dist, "get_global_rank", None) or \
                dist.distributed_c10d._get_global_rank
            root = global_rank(group, 0)
        dist.broadcast(buf, src=root, group=group)
        return cls(nranks, rank, buf.cpu(), device, **config)

    # ------------------------------------------------------------------ life cycle
    @property
    def handle(self):
        """The raw fuscoComm_t (a ctypes.c_void_p); FuscoError after destroy()."""
        if self._handle is None:
            raise FuscoError(_lib.INVALID_USAGE, "fusco: the communicator was destroyed")
        return self._handle

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def _adopt(self, child):
        """Something holding a handle of this comm (a MoE plan): closed before the comm."""
        self._children.add(child)

    def _release_children(self):
        for c in list(self._children):
            c.close()

    def _end(self, name):
        """Closes every MoE plan made on the comm, then frees it with fusco's `name`. Idempotent."""
        if self._handle is None:
            return
        self._release_children()
        h, self._handle = self._handle, None
        check(getattr(self._lib, name)(h), None, name)

    def destroy(self):
        """Frees the comm and every MoE plan made on it (collective-free). Idempotent."""
        self._end("fuscoCommDestroy")

    def abort(self):
        """Wakes every blocked call of this comm with an error, then frees it."""
        self._end("fuscoCommAbort")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    # ------------------------------------------------------------------ queries
    def node_info(self):
        """(node, num_nodes, local_rank, local_size)."""
        v = [ctypes.c_int() for _ in range(4)]
        check(self._lib.fuscoCommNodeInfo(self.handle, *[ctypes.byref(x) for x in v]), self.handle)
        return tuple(x.value for x in v)

    def async_error(self):
        """None, or the FuscoError that broke the communicator."""
        r = ctypes.c_int()
        check(self._lib.fuscoCommGetAsyncError(self.handle, ctypes.byref(r)), self.handle)
        return None if r.value == _lib.SUCCESS else FuscoError(r.value, "communicator broken")

    # ------------------------------------------------------------------ helpers for calls
    def stream(self):
        """The `stream` argument of a data call: NULL for host comms, else the current stream
        of the comm's device (as an integer handle)."""
        if not self.is_cuda:
            return None
        return torch.cuda.current_stream(self.device).cuda_stream

    def check_tensor(self, t, name):
        """FuscoError unless t is a tensor in this comm's memory space."""
        if not isinstance(t, torch.Tensor):
            raise invalid("fusco: %s must be a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.device.type != self.device.type or (self.is_cuda and t.device != self.device):
            raise invalid("fusco: %s is on %s but the communicator's memory is on %s"
                          % (name, t.device, self.device))

    def call(self, what, fn, *args):
        """Runs a library call and raises FuscoError with the comm's message if it fails."""
        check(fn(*args), self.handle, what)

    def __repr__(self):
        state = "destroyed" if self._handle is None else "rank %d of %d" % (self.rank, self.nranks)
        return "fusco.Communicator(%s, %s)" % (state, self.device)
