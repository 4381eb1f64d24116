"""The low-latency calls of deep_ep.Buffer (a mixin over self._fusco and self._ll)."""
import ctypes

import torch

from .. import _lib
from ..comm import check
from . import low_latency as ll


class LowLatencyCalls:
    """low_latency_dispatch / low_latency_combine / their helpers, DeepEP's signatures."""

    def _ll_state(self, n, hidden, experts, topk):
        key = (n, hidden, experts, topk)
        if self._ll is not None and self._ll.key != key:
            self._ll.destroy()  # collective, like the create: every rank changes sizes alike
            self._ll = None
        if self._ll is None:
            self._ll = ll.State(self._fusco, n, hidden, experts, topk)
        return self._ll

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False,
                             use_nvfp4=False, x_global_scale=None):
        ll.refuse(round_scale or use_ue8m0, "round_scale / use_ue8m0 (UE8M0 scales)")
        ll.refuse(use_nvfp4, "use_nvfp4 (NVFP4 dispatch)")
        ll.refuse(dispatch_wait_recv_cost_stats is not None, "dispatch_wait_recv_cost_stats")
        if async_finish and return_recv_hook:
            raise ValueError("deep_ep.low_latency_dispatch: async_finish and return_recv_hook "
                             "exclude each other")
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            raise ValueError("deep_ep.low_latency_dispatch: x must be [tokens, hidden] bf16")
        n, t, hidden, k = int(num_max_dispatch_tokens_per_rank), x.shape[0], x.shape[1], \
            topk_idx.shape[1]
        if t > n:
            raise ValueError("deep_ep.low_latency_dispatch: %d tokens, more than "
                             "num_max_dispatch_tokens_per_rank (%d)" % (t, n))
        st = self._ll_state(n, hidden, int(num_experts), k)
        out = _lib.LowLatencyDispatch()
        flags = _lib.LL_RECV_HOOK if return_recv_hook else 0
        fmt = _lib.LL_FP8 if use_fp8 else _lib.LL_BF16
        x, idx = x.contiguous(), topk_idx.contiguous()
        check(_lib.load().fuscoLowLatencyDispatch(st.handle, x.data_ptr(), idx.data_ptr(), t, k,
                                                  fmt, flags, ctypes.byref(out),
                                                  self._fusco.stream()),
              self._fusco.handle, "deep_ep.low_latency_dispatch")
        recv_x, count, layout, src = ll.received(st, out, use_fp8)
        scales = ll.column_major(recv_x[1]) if use_fp8 else None

        def finish():
            if use_fp8:
                scales.copy_(recv_x[1])
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(count)

        hook = None
        if return_recv_hook:
            def hook():
                check(_lib.load().fuscoLowLatencyRecvHook(st.handle, out.hook,
                                                          self._fusco.stream()),
                      self._fusco.handle, "deep_ep: the low-latency dispatch's receive hook")
                finish()
        else:
            finish()
        handle = (src, layout, n, hidden, int(num_experts), ll.Dispatched(st, out, k, t))
        packed = (recv_x[0], scales) if use_fp8 else recv_x
        return packed, count, handle, ll.events(async_finish), hook

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False, out=None,
                            combine_wait_recv_cost_stats=None, overlap=False, **sbo_keywords):
        ll.refuse(use_logfmt, "use_logfmt (LogFMT combine)")
        ll.refuse(overlap, "overlap=True (single-batch overlap)")
        ll.refuse(combine_wait_recv_cost_stats is not None, "combine_wait_recv_cost_stats")
        if async_finish and return_recv_hook:
            raise ValueError("deep_ep.low_latency_combine: async_finish and return_recv_hook "
                             "exclude each other")
        d = handle[5]
        st = d.state
        if zero_copy:
            x = st.combine_buffer(d.out.buffer)
        if x.dtype != torch.bfloat16:
            raise ValueError("deep_ep.low_latency_combine: x must be bf16")
        t, k = topk_idx.shape
        if out is None:
            out = torch.empty((t, st.key[1]), dtype=torch.bfloat16, device=x.device)
        x, idx = x.contiguous(), topk_idx.contiguous()
        w = topk_weights.to(torch.float32).contiguous()
        hook_id = ctypes.c_ulonglong(0)
        flags = _lib.LL_RECV_HOOK if return_recv_hook else 0
        check(_lib.load().fuscoLowLatencyCombine(st.handle, ctypes.byref(d.out), x.data_ptr(),
                                                 idx.data_ptr(), w.data_ptr(), t, k,
                                                 out.data_ptr(), flags, ctypes.byref(hook_id),
                                                 self._fusco.stream()),
              self._fusco.handle, "deep_ep.low_latency_combine")
        hook = None
        if return_recv_hook:
            def hook():
                check(_lib.load().fuscoLowLatencyRecvHook(st.handle, hook_id.value,
                                                          self._fusco.stream()),
                      self._fusco.handle, "deep_ep: the low-latency combine's receive hook")
        return out, ll.events(async_finish), hook

    def get_next_low_latency_combine_buffer(self, handle):
        d = handle[5]
        return d.state.combine_buffer(d.out.buffer)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """fusco's low-latency buffer is its own (the normal mode never writes it) and its
        signals carry call numbers, so there is nothing to zero; the arguments are checked."""
        for v in (num_max_dispatch_tokens_per_rank, hidden, num_experts):
            if int(v) <= 0:
                raise ValueError("deep_ep.clean_low_latency_buffer: sizes must be positive")
