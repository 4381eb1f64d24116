"""DeepEP's low-latency (decode) mode on fuscoLowLatency* (docs/API.md, "Low-latency dispatch
and combine"): the same two alternating buffers, the same per-expert receive layout
([E_l, R * N, H] rows, `(begin << 32) | count` per source, source token indices), FP8 with one
fp32 scale per 128 channels, hooks, and combine's weighted sum. The received tensors are views of
fusco's buffer, valid until the dispatch two calls later, as DeepEP's are.
"""
import ctypes
import math

import torch

from .. import _lib
from ..comm import check
from .utils import EventHandle, EventOverlap


def refuse(flag, why):
    """NotImplementedError naming a DeepEP feature fusco does not provide, when it is asked for."""
    if flag:
        raise NotImplementedError("deep_ep (fusco): %s" % why)


class _CudaArray:
    """A device pointer with __cuda_array_interface__, for a zero-copy torch view."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "version": 2}


# Signed integers of each size: every torch has them (unsigned 16/32/64-bit are recent).
_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def view(ptr, shape, dtype, device):
    """A tensor of `shape` and `dtype` over fusco's memory at ptr (no copy)."""
    count = math.prod(shape)
    size = torch.empty((), dtype=dtype).element_size()
    if count == 0 or not ptr:
        return torch.empty(shape, dtype=dtype, device=device)
    if device.type == "cpu":
        raw = (ctypes.c_char * (count * size)).from_address(ptr)
        return torch.frombuffer(raw, dtype=dtype, count=count).view(shape)
    t = torch.as_tensor(_CudaArray(ptr, shape, _TYPESTR[size]), device=device)
    return t.view(_AS_INT[size]).view(dtype) if dtype.is_floating_point else t.view(dtype)


def fp8_dtype():
    """torch.float8_e4m3fn where this torch has it, else uint8 (the same bytes)."""
    return getattr(torch, "float8_e4m3fn", torch.uint8)


class State:
    """One fuscoLowLatency_t (created at the first call with its sizes, collectively)."""

    def __init__(self, comm, n, hidden, experts, topk):
        cfg = _lib.LowLatencyConfig()
        cfg.maxTokensPerRank, cfg.hidden, cfg.numExperts, cfg.maxTopk = n, hidden, experts, topk
        self.comm = comm
        self.key = (n, hidden, experts, topk)
        self.local = experts // comm.nranks
        self.handle = ctypes.c_void_p()
        lib = _lib.load()
        check(lib.fuscoLowLatencyCreate(ctypes.byref(self.handle), comm.handle, ctypes.byref(cfg)),
              comm.handle, "deep_ep: fuscoLowLatencyCreate")
        self.zero_copy = {}

    def destroy(self):
        if self.handle is not None:
            h, self.handle = self.handle, None
            check(_lib.load().fuscoLowLatencyDestroy(h), self.comm.handle,
                  "deep_ep: fuscoLowLatencyDestroy")

    def combine_buffer(self, which):
        """The bf16 [E_l, R * N, H] tensor that combine reads with zero_copy, one per half."""
        if which not in self.zero_copy:
            n, hidden = self.key[0], self.key[1]
            self.zero_copy[which] = torch.zeros((self.local, self.comm.nranks * n, hidden),
                                                dtype=torch.bfloat16, device=self.comm.device)
        return self.zero_copy[which]


class Dispatched:
    """The fusco side of an LL handle: the dispatch's result and its state."""

    def __init__(self, state, out, topk, ntokens):
        self.state, self.out, self.topk, self.ntokens = state, out, topk, ntokens


def received(state, out, use_fp8):
    """Views of what a dispatch wrote: (recv_x or (x, row-major scales), count, layout, src)."""
    n, hidden = state.key[0], state.key[1]
    rows = (state.local, state.comm.nranks * n)
    dev = state.comm.device
    if use_fp8:
        x = view(out.recvX, rows + (hidden,), torch.uint8, dev).view(fp8_dtype())
        scales = view(out.recvScales, rows + (hidden // 128,), torch.float32, dev)
        x = (x, scales)
    else:
        x = view(out.recvX, rows + (hidden,), torch.bfloat16, dev)
    count = view(out.recvCount, (state.local,), torch.int32, dev)
    layout = view(out.recvLayout, (state.local, state.comm.nranks), torch.int64, dev)
    src = view(out.recvSrcToken, rows, torch.int32, dev)
    return x, count, layout, src


def column_major(scales):
    """DeepEP's TMA layout: the same [E_l, R * N, H / 128] values stored column-major in the last
    two dimensions."""
    cm = torch.empty((scales.shape[0], scales.shape[2], scales.shape[1]), dtype=scales.dtype,
                     device=scales.device).transpose(1, 2)
    return cm.copy_(scales)


def events(async_finish):
    return EventOverlap(EventHandle()) if async_finish else EventOverlap(None)
