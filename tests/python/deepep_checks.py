"""Helpers of the DeepEP compatibility tests, on plain torch only: the module under test (fusco's
`fusco.deep_ep`, or any `deep_ep` named by DEEP_EP_MODULE, so the same tests can run against real
DeepEP on a GPU), an e4m3 codec (Debian's torch has no float8 dtype: FP8 travels as uint8 bytes,
decoded here), DeepEP's per-128-channel FP8 cast and its `calc_diff`.
"""
import hashlib
import importlib
import os

import torch
import torch.distributed as dist

MODULE = os.environ.get("DEEP_EP_MODULE", "fusco.deep_ep")


def deep_ep():
    return importlib.import_module(MODULE)


def deep_ep_utils():
    return importlib.import_module(MODULE + ".utils")


def _e4m3_values():
    """The 256 values of float8 e4m3fn (bias 7, no infinities, 0x7f/0xff NaN)."""
    v = torch.empty(256, dtype=torch.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 15 and m == 7:
            v[b] = float("nan")
        elif e == 0:
            v[b] = sign * m / 8.0 * 2.0 ** -6
        else:
            v[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return v


E4M3 = _e4m3_values()
_FINITE = torch.tensor([b for b in range(256) if not torch.isnan(E4M3[b])], dtype=torch.int64)
_ORDER = torch.argsort(E4M3[_FINITE])
_SORTED_BYTES = _FINITE[_ORDER]
_SORTED_VALUES = E4M3[_SORTED_BYTES]


def fp8_bytes(t):
    """The bytes of an FP8 tensor (float8_e4m3fn where torch has it, else uint8)."""
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def decode_fp8(t):
    return E4M3[fp8_bytes(t).long()].to(torch.float32)


def encode_fp8(x):
    """Round-to-nearest e4m3 bytes (uint8) of float values inside [-448, 448]."""
    flat = x.double().flatten()
    hi = torch.searchsorted(_SORTED_VALUES, flat).clamp(1, len(_SORTED_VALUES) - 1)
    lo = hi - 1
    pick = torch.where((flat - _SORTED_VALUES[lo]).abs() <= (_SORTED_VALUES[hi] - flat).abs(),
                       lo, hi)
    return _SORTED_BYTES[pick].to(torch.uint8).view(x.shape)


def per_token_cast_to_fp8(x):
    """DeepEP's input FP8 format: e4m3 rows with one fp32 scale per 128 channels,
    scale = max(amax, 1e-4) / 448."""
    t, h = x.shape
    g = x.float().view(t, h // 128, 128)
    scale = g.abs().amax(-1).clamp(min=1e-4) / 448.0
    q = encode_fp8(g / scale.unsqueeze(-1)).view(t, h)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return (q.view(fp8) if fp8 is not None else q), scale


def per_token_cast_back(q, scale):
    t, h = q.shape[-2], q.shape[-1]
    v = decode_fp8(q).view(*q.shape[:-1], h // 128, 128)
    return (v * scale.float().unsqueeze(-1)).view(*q.shape[:-2], t, h)


def calc_diff(x, y):
    """DeepEP's similarity measure: 1 - 2 sum(xy) / sum(x^2 + y^2) over x + 1, y + 1 (float64)."""
    x, y = x.double() + 1, y.double() + 1
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom)


def all_gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return torch.stack(out)


def all_reduce(t):
    t = t.clone()
    dist.all_reduce(t)
    return t


def routing(gen, tokens, experts, topk):
    """DeepEP's tests' routing: the top-k of |randn| + 1 scores (every slot valid)."""
    scores = torch.randn(tokens, experts, generator=gen).abs() + 1
    return torch.topk(scores, topk, dim=-1, largest=True, sorted=False).indices.to(torch.int64)


def digest(t):
    """A digest of a tensor's bytes, for determinism checks (same bytes, same digest)."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
