"""A DeepEP-compatible API on fusco: `import fusco.deep_ep as deep_ep`, or `import deep_ep` with
the opt-in alias package (plugins/torch/deep_ep_alias). DeepEP's V1 `Buffer` (normal and
low-latency modes), `Config`, `EventHandle`, `EventOverlap` and `topk_idx_t`; the calls,
keywords and tensor layouts that Megatron-LM, vLLM and SGLang use, run on fusco's engine. What is
supported, and what is refused with NotImplementedError, is listed in docs/API.md ("DeepEP
compatibility").
"""
import torch

from .buffer import Buffer
from .config import Config
from .utils import EventHandle, EventOverlap

topk_idx_t = torch.int64

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t"]
