"""DeepEP's V1 `Buffer` on fusco: the constructor and attributes frameworks use, the static
helpers, and the normal mode. The low-latency calls are in ll_calls.py (a mixin).

CPU tensors go with a gloo group (a host communicator: every call is complete on return, events
are ready at once); CUDA tensors with an NCCL group (a CUDA communicator: calls are ordered on
torch's current stream, `previous_event` is waited for, `async_finish` records an event after the
call). DeepEP's own comm stream, and `allocate_on_comm_stream`, have no counterpart: the current
stream does the work.
"""
import os

import torch
import torch.distributed as dist

from ..comm import Communicator
from . import normal
from .config import Config
from .ll_calls import LowLatencyCalls
from .low_latency import refuse
from .utils import EventHandle, EventOverlap


def _device():
    """Where the buffer's tensors live: CUDA (torch's current device) where torch sees a GPU, as
    DeepEP, else the host; FUSCO_DEEP_EP_DEVICE=cpu|cuda chooses (a CPU run on a GPU machine).
    The group's backend does not decide it: vLLM passes a gloo group with CUDA tensors."""
    want = os.environ.get("FUSCO_DEEP_EP_DEVICE", "")
    if want not in ("", "cpu", "cuda"):
        raise ValueError("deep_ep: FUSCO_DEEP_EP_DEVICE must be cpu or cuda, not %r" % want)
    if want == "cpu" or (not want and not torch.cuda.is_available()):
        return "cpu"
    return torch.device("cuda", torch.cuda.current_device())


def _begin(previous_event, async_finish, allocate_on_comm_stream, what):
    if allocate_on_comm_stream and (previous_event is None or not async_finish):
        raise ValueError("deep_ep.%s: allocate_on_comm_stream needs previous_event and "
                         "async_finish, as DeepEP's" % what)
    if previous_event is not None:
        previous_event.current_stream_wait()


def _finish(async_finish):
    return EventOverlap(EventHandle()) if async_finish else EventOverlap(None)


class Buffer(LowLatencyCalls):
    """DeepEP's Buffer: accepts every V1 keyword (and UCCL's `is_intranode`)."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                 use_fabric=False, explicitly_destroy=False, enable_shrink=False, comm=None,
                 is_intranode=None):
        refuse(enable_shrink, "enable_shrink=True (masking failed ranks) is not supported; "
                "fusco reports a dead peer as an error on every survivor")
        refuse(comm is not None, "comm= (an mpi4py communicator) is not supported; pass a "
                "torch.distributed group")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.group_size = dist.get_world_size(self.group)
        self.num_nvl_bytes = int(num_nvl_bytes)
        self.num_rdma_bytes = int(num_rdma_bytes)
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        self._fusco = Communicator.from_process_group(self.group, device=_device())
        self._ll = None

    # ------------------------------------------------------------------ static helpers
    @staticmethod
    def set_num_sms(new_num_sms):
        if new_num_sms % 2 != 0:
            raise ValueError("deep_ep.Buffer.set_num_sms: the SM count must be even")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture():
        return EventOverlap(EventHandle())

    @staticmethod
    def get_dispatch_config(num_ranks):
        """DeepEP's tuned table has 12 rank counts; fusco takes any (its engine sizes itself)."""
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts):
        """Bytes of one rank's low-latency buffer (two halves of a receive and a send area)."""
        rows = int(num_max_dispatch_tokens_per_rank) * int(num_ranks) * \
            max(1, int(num_experts) // max(1, int(num_ranks)))
        row = int(hidden) * 2 + int(hidden) // 128 * 4 + 16
        return 2 * 2 * rows * row

    def get_comm_stream(self):
        return torch.cuda.current_stream() if self._fusco.is_cuda else None

    # ------------------------------------------------------------------ life cycle
    def destroy(self):
        if not self.explicitly_destroy:
            raise RuntimeError("deep_ep.Buffer.destroy: the buffer was made without "
                               "explicitly_destroy=True")
        self._release()

    def _release(self):
        if self._ll is not None:
            self._ll.destroy()
            self._ll = None
        if self._fusco is not None:
            self._fusco.destroy()
            self._fusco = None

    def __del__(self):
        try:
            self._release()
        except Exception:
            pass

    # ------------------------------------------------------------------ normal mode
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        _begin(previous_event, async_finish, allocate_on_comm_stream, "get_dispatch_layout")
        per_rank, per_rdma, per_expert, in_rank = normal.dispatch_layout(
            topk_idx, int(num_experts), self.group_size)
        return per_rank, per_rdma, per_expert, in_rank, _finish(async_finish)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        _begin(previous_event, async_finish, allocate_on_comm_stream, "dispatch")
        xs = list(x) if isinstance(x, tuple) else [x]
        if handle is not None:
            plan = handle[1]
            got, _, _, _ = normal.run_dispatch(self._fusco, plan, xs, None, None, plan.num_recv)
            out = tuple(got) if isinstance(x, tuple) else got[0]
            return out, None, None, None, None, _finish(async_finish)
        if num_tokens_per_rank is None or is_token_in_rank is None or \
                num_tokens_per_expert is None:
            raise ValueError("deep_ep.dispatch: without a handle, num_tokens_per_rank, "
                             "is_token_in_rank and num_tokens_per_expert are needed "
                             "(get_dispatch_layout)")
        plan = normal.Plan(self._fusco, num_tokens_per_rank, is_token_in_rank,
                           num_tokens_per_expert)
        rows = plan.num_recv
        if num_worst_tokens > 0:
            if plan.num_recv > num_worst_tokens:
                raise ValueError("deep_ep.dispatch: %d rows received, more than num_worst_tokens "
                                 "(%d)" % (plan.num_recv, num_worst_tokens))
            rows = int(num_worst_tokens)
        got, ridx, rw, src = normal.run_dispatch(self._fusco, plan, xs, topk_idx, topk_weights,
                                                 rows)
        out = tuple(got) if isinstance(x, tuple) else got[0]
        align = max(1, int(expert_alignment))
        counts = [] if num_worst_tokens > 0 else \
            [int(-(-c // align) * align) for c in plan.recv_per_expert.tolist()]
        return out, ridx, rw, counts, plan.handle(src), _finish(async_finish)

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        _begin(previous_event, async_finish, allocate_on_comm_stream, "combine")
        biases = [] if bias is None else (list(bias) if isinstance(bias, tuple) else [bias])
        out, out_w = normal.run_combine(self._fusco, handle[1], x, topk_weights, biases)
        return out, out_w, _finish(async_finish)

    # fusco routes across nodes itself: DeepEP's internode entry points are the same calls.
    internode_dispatch = dispatch
    internode_combine = combine
