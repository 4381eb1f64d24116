"""fusco.MoEDispatcher: Megatron's all-to-all token dispatcher interface on fusco's MoE calls.

Forward: dispatch = fuscoMoePlan + fuscoMoeDispatch (rows land expert-major: local experts
ascending, then source rank, then token, exactly the order Megatron gets after permute ->
all_to_all_single -> sort_chunks_by_idxs); combine = fuscoMoeCombine with the router
probabilities as topkWeights (fp32 accumulation, a fixed summation order).

Backward (autograd.Function):
- dispatch:  grad_x = fuscoMoeCombine(grad_y, weights=NULL): each token sums the gradients of
  its slots (padding rows are not read).
- combine:   g = fuscoMoeDispatch(grad_out) puts grad_out[t] on every slot of t, so
  grad_expert_out[slot(t,k)] = probs[t,k] * g[slot(t,k)], and
  grad_probs[t,k] = <grad_out[t], expert_out[slot(t,k)]> = <g, expert_out> of that slot (row dot
  products, computed on the expert side where both rows already are).
  Both need values per *slot* (t,k) rather than per token, which fuscoMoeDispatch cannot move (it
  sends one row per token and destination rank). The "slot map" does: one more fuscoMoeDispatch
  at plan time carries each token's source rank to its slots, so the expert side knows which
  slots came from which rank, in which order (docs/API.md: block of local expert e = tokens of rank
  0, then rank 1, ..., tokens ascending). The source side orders its valid (t,k) by (destination
  rank, expert, t) - the same order. fusco.all_to_all (fuscoGatherSend / fuscoScatterRecv)
  between those two index lists moves one value per slot: probs[t,k] to its slot (to_slots) and
  the slot dot products back to grad_probs[t,k] (from_slots), exactly, in any dtype.
- dtypes that fuscoMoeCombine does not take (float64): combine and dispatch's backward bring the
  slot rows back with from_slots and sum over k in that dtype (used for gradcheck).

Every call here is collective over the comm, in the same order on every rank. A rank that finds
its own arguments bad still enters the collective with an argument fusco rejects (so the peers fail
promptly, not after the timeout) and raises FuscoError with the plugin's message.
"""
import ctypes
import math

import torch

from . import _lib
from .comm import Communicator, FuscoError, invalid
from .layout import _fail_collectively, all_to_all

_COMBINE_TYPES = {torch.float32: _lib.FLOAT32, torch.bfloat16: _lib.BFLOAT16,
                  torch.float16: _lib.FLOAT16}


def _acc_dtype(*dtypes):
    return torch.float64 if torch.float64 in dtypes else torch.float32


class Route:
    """One routing planned by fuscoMoePlan (owns the fuscoMoeHandle_t) and what derives from it.
    Shared by the autograd nodes of one dispatch and its combine, so a dispatcher may plan the
    next batch while an older graph still waits for its backward."""

    def __init__(self, comm, cfg, topk_idx, expert_rank, n_local, expert_alignment, slot_map):
        self.comm = comm
        self._lib = _lib.load()
        self._handle = None
        self.topk_idx = topk_idx  # [T, k] int64, contiguous, in the comm's memory space
        self.num_tokens, self.topk = topk_idx.shape
        h = ctypes.c_void_p()
        comm.call("fuscoMoePlan", self._lib.fuscoMoePlan, ctypes.byref(h), comm.handle,
                  ctypes.byref(cfg), topk_idx.data_ptr() or None, self.num_tokens, self.topk,
                  comm.stream())
        self._handle = h
        comm._adopt(self)
        counts = (ctypes.c_int64 * max(1, n_local))()
        rows = ctypes.c_size_t()
        comm.call("fuscoMoeGetRecvCounts", self._lib.fuscoMoeGetRecvCounts, h, ctypes.byref(rows),
                  counts)
        self.num_recv_rows = rows.value
        self.tokens_per_expert = torch.tensor(list(counts)[:n_local], dtype=torch.int64)
        a = max(1, expert_alignment)
        self.rows_per_expert = (self.tokens_per_expert + a - 1) // a * a
        if int(self.rows_per_expert.sum()) != self.num_recv_rows:  # docs/API.md's padding rule
            raise FuscoError(_lib.INTERNAL_ERROR, "fusco: %d rows received but the padded expert "
                             "blocks %s add up to %d" % (self.num_recv_rows,
                                                         self.rows_per_expert.tolist(),
                                                         int(self.rows_per_expert.sum())))
        self.expert_rank = expert_rank  # [E] int64 on the comm's device
        self.send_pos = self.recv_slot = None
        if slot_map:
            self._build_slot_map()

    @staticmethod
    def fail_plan(comm, cfg, err):
        """Enters fuscoMoePlan with a NULL handle (so the peers fail promptly), then raises err."""
        lib = _lib.load()
        lib.fuscoMoePlan(None, comm.handle, ctypes.byref(cfg), None, 0, 1, comm.stream())
        raise err

    @property
    def handle(self):
        if self._handle is None:
            raise FuscoError(_lib.INVALID_USAGE, "fusco: this routing's MoE plan was freed (its "
                             "communicator was destroyed)")
        return self._handle

    def close(self):
        if self._handle is not None:
            h, self._handle = self._handle, None
            if self.comm._handle is not None:
                self._lib.fuscoMoeHandleDestroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ data movement
    def dispatch(self, x):
        """[T, ...] -> [numRecvRows, ...] expert-major rows (bytes copied verbatim, any dtype)."""
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        err = None
        if x.shape[0] != self.num_tokens:
            err = invalid("fusco dispatch: %d rows for a routing of %d tokens"
                          % (x.shape[0], self.num_tokens))
        elif row_bytes == 0:
            err = invalid("fusco dispatch: rows of 0 bytes")
        else:
            try:
                self.comm.check_tensor(x, "hidden_states")
            except FuscoError as e:
                err = e
        if err is not None:
            self._lib.fuscoMoeDispatch(self.handle, None, 0, None, self.comm.stream())
            raise err
        x = x.contiguous()
        y = torch.empty((self.num_recv_rows,) + tuple(x.shape[1:]), dtype=x.dtype,
                        device=x.device)
        self.comm.call("fuscoMoeDispatch", self._lib.fuscoMoeDispatch, self.handle,
                       x.data_ptr() or None, row_bytes, y.data_ptr() or None, self.comm.stream())
        return y

    def _combine_error(self, rows, weights):
        """The plugin's complaint about combine's arguments on this rank, or None."""
        try:
            self.comm.check_tensor(rows, "expert_output")
        except FuscoError as e:
            return e
        if rows.dim() != 2 or rows.shape[0] != self.num_recv_rows:
            return invalid("fusco combine: expert output has shape %s, expected [%d, hidden] (the "
                           "rows of the dispatch)" % (tuple(rows.shape), self.num_recv_rows))
        if rows.shape[1] == 0:
            return invalid("fusco combine: hidden size 0")
        if not rows.is_floating_point():
            return invalid("fusco combine: expert output has dtype %s, not a float" % rows.dtype)
        if weights is not None and tuple(weights.shape) != (self.num_tokens, self.topk):
            return invalid("fusco combine: probs have shape %s, expected [%d, %d]"
                           % (tuple(weights.shape), self.num_tokens, self.topk))
        return None

    def combine(self, rows, weights):
        """[numRecvRows, H] -> [T, H]: out[t] = sum_k weights[t,k] * rows[slot(t,k)] (weights
        None: 1). fuscoMoeCombine for fp32/bf16/fp16, else (float64) from_slots and a local sum."""
        err = self._combine_error(rows, weights)
        # Peers with good arguments take fuscoMoeCombine unless the rows are float64 (the slot
        # path); a rank with bad ones enters the same call to fail them promptly.
        native = not (isinstance(rows, torch.Tensor) and rows.is_floating_point() and
                      rows.dtype not in _COMBINE_TYPES)
        if err is not None:
            if native or self.send_pos is None:
                self._lib.fuscoMoeCombine(self.handle, None, _lib.FLOAT32, 0, None, None,
                                          self.comm.stream())
                raise err
            _fail_collectively(self.comm, err)
        hidden = rows.shape[1]
        if not native:
            if self.send_pos is None:  # planned for a native dtype; every rank gets here alike
                self._build_slot_map()
            per_slot = self.from_slots(rows.contiguous()).view(self.num_tokens, self.topk, hidden)
            if weights is not None:
                per_slot = per_slot * weights.to(rows.dtype).unsqueeze(-1)
            return per_slot.sum(1)
        rows = rows.contiguous()
        w = None
        if weights is not None:
            w = weights.detach().to(torch.float32).contiguous()
        out = torch.empty((self.num_tokens, hidden), dtype=rows.dtype, device=rows.device)
        self.comm.call("fuscoMoeCombine", self._lib.fuscoMoeCombine, self.handle,
                       rows.data_ptr() or None, _COMBINE_TYPES[rows.dtype], hidden,
                       (w.data_ptr() or None) if w is not None else None, out.data_ptr() or None,
                       self.comm.stream())
        return out

    # ------------------------------------------------------------------ per-slot values
    def _build_slot_map(self):
        """Collective: the index lists that pair each valid (t,k) of this rank with its slot."""
        comm, dev = self.comm, self.topk_idx.device
        src = torch.full((self.num_tokens, 1), comm.rank + 1, dtype=torch.int64, device=dev)
        slot_src = self.dispatch(src).view(-1) - 1  # padding rows are zero-filled: -1
        slots = torch.arange(self.num_recv_rows, device=dev)[slot_src >= 0]
        srcs = slot_src[slot_src >= 0]
        # Expert side: the slots of each source rank in block order (stable sort by source).
        self.recv_slot = slots[torch.sort(srcs, stable=True).indices].contiguous()
        self.recv_counts = torch.bincount(srcs, minlength=comm.nranks).cpu().tolist()
        # Source side: valid (t,k) ordered by (destination rank, expert, token).
        flat = self.topk_idx.view(-1)
        pos = torch.arange(flat.numel(), device=dev)[flat >= 0]
        e = flat[flat >= 0]
        dest = self.expert_rank[e]
        num_experts = self.expert_rank.numel()
        key = (dest * num_experts + e) * max(1, self.num_tokens) + pos // self.topk
        self.send_pos = pos[torch.argsort(key)].contiguous()
        self.send_counts = torch.bincount(dest, minlength=comm.nranks).cpu().tolist()

    def to_slots(self, values):
        """[T*k, ...] values per (t,k) -> [numRecvRows, ...] per slot (padding rows 0)."""
        out = torch.zeros((self.num_recv_rows,) + tuple(values.shape[1:]), dtype=values.dtype,
                          device=values.device)
        return all_to_all(out, values.contiguous(), self.send_pos, self.recv_slot,
                          self.send_counts, self.recv_counts, self.comm, validate=False)

    def from_slots(self, rows):
        """[numRecvRows, ...] per slot -> [T*k, ...] per (t,k) (slots with expert -1: 0)."""
        out = torch.zeros((self.num_tokens * self.topk,) + tuple(rows.shape[1:]), dtype=rows.dtype,
                          device=rows.device)
        return all_to_all(out, rows.contiguous(), self.recv_slot, self.send_pos,
                          self.recv_counts, self.send_counts, self.comm, validate=False)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, route):
        ctx.route = route
        ctx.x_shape = x.shape
        return route.dispatch(x)

    @staticmethod
    def backward(ctx, grad_y):
        route = ctx.route
        row = math.prod(grad_y.shape[1:])
        g = grad_y.contiguous().view(grad_y.shape[0], row)
        if g.dtype in _COMBINE_TYPES:
            gx = route.combine(g, None)
        else:
            if route.send_pos is None:
                route._build_slot_map()
            gx = route.from_slots(g).view(route.num_tokens, route.topk, row).sum(1)
        return gx.view(ctx.x_shape), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, probs, route):
        ctx.route = route
        ctx.has_probs = probs is not None
        ctx.save_for_backward(expert_out, probs)
        return route.combine(expert_out, probs)

    @staticmethod
    def backward(ctx, grad_out):
        route = ctx.route
        expert_out, probs = ctx.saved_tensors
        g = route.dispatch(grad_out.contiguous())  # grad_out[t] on every slot of t
        if not ctx.has_probs:
            return g.to(expert_out.dtype), None, None
        # The same collective calls whatever needs a gradient, so ranks never disagree on them.
        acc = _acc_dtype(expert_out.dtype, probs.dtype)
        p_slot = route.to_slots(probs.detach().reshape(-1).to(acc))
        gacc = g.to(acc)
        grad_e = (gacc * p_slot.unsqueeze(-1)).to(expert_out.dtype)
        dots = (gacc * expert_out.to(acc)).sum(-1)
        grad_p = route.from_slots(dots).view(route.num_tokens, route.topk).to(probs.dtype)
        return grad_e, grad_p, None


def _routing_map_to_topk(routing_map):
    """[T, E] bool -> [T, k] int64 (the True experts ascending, -1 after), k = max per token."""
    num_tokens, num_experts = routing_map.shape
    k = int(routing_map.sum(1).max().item()) if num_tokens > 0 else 1
    k = max(1, k)
    ids = torch.arange(num_experts, device=routing_map.device).expand(num_tokens, -1)
    ids = torch.where(routing_map, ids, torch.full_like(ids, num_experts))
    top = torch.sort(ids, dim=1).values[:, :k]
    return torch.where(top == num_experts, torch.full_like(top, -1), top).contiguous()


class MoEDispatcher:
    """Megatron's MoEAlltoAllTokenDispatcher on fusco.

    dispatcher = fusco.MoEDispatcher(comm, num_experts)
    tokens, tokens_per_expert = dispatcher.dispatch(hidden_states, probs, topk_indices)
    output = dispatcher.combine(experts(tokens, tokens_per_expert))

    comm: a fusco.Communicator (its ranks are the expert-parallel group).
    num_experts: global expert count; expert_to_rank: optional placement ([num_experts] ranks,
    the same on every rank; default contiguous blocks of num_experts / nranks).
    dedup, balance: fusco's modes ("auto", "none", "rank", "node"; they change traffic, never
    results). expert_alignment: pad each local expert's block of rows to a multiple of this
    (padding rows are zero; tokens_per_expert then counts the padded blocks).
    """

    def __init__(self, comm, num_experts, expert_to_rank=None, *, dedup="auto", balance="auto",
                 expert_alignment=0):
        if not isinstance(comm, Communicator):
            raise invalid("fusco.MoEDispatcher: comm must be a fusco.Communicator")
        self.comm = comm
        n = comm.nranks
        num_experts = int(num_experts)
        if num_experts <= 0:
            raise invalid("fusco.MoEDispatcher: num_experts %d must be > 0" % num_experts)
        if expert_to_rank is None:
            if num_experts % n != 0:
                raise invalid("fusco.MoEDispatcher: %d experts do not split evenly over %d ranks; "
                              "pass expert_to_rank" % (num_experts, n))
            placement = [e // (num_experts // n) for e in range(num_experts)]
        else:
            if isinstance(expert_to_rank, torch.Tensor):
                expert_to_rank = expert_to_rank.cpu().tolist()
            placement = [int(r) for r in expert_to_rank]
            if len(placement) != num_experts or any(r < 0 or r >= n for r in placement):
                raise invalid("fusco.MoEDispatcher: expert_to_rank must give each of %d experts "
                              "a rank in [0, %d)" % (num_experts, n))
        self.num_experts = num_experts
        self.expert_to_rank = placement
        self.local_expert_indices = [e for e in range(num_experts) if placement[e] == comm.rank]
        self.num_local_experts = len(self.local_expert_indices)
        self.expert_alignment = int(expert_alignment)
        self._placement = (ctypes.c_int * num_experts)(*placement)  # kept alive for the config
        self._cfg = _lib.MoeConfig()
        self._cfg.numExperts = num_experts
        self._cfg.expertToRank = ctypes.cast(self._placement, ctypes.POINTER(ctypes.c_int))
        self._cfg.dedup = _lib.DEDUP[dedup] if isinstance(dedup, str) else int(dedup)
        self._cfg.balance = _lib.BALANCE[balance] if isinstance(balance, str) else int(balance)
        self._cfg.expertAlignment = self.expert_alignment
        self._expert_rank = torch.tensor(placement, dtype=torch.int64, device=comm.device)
        self.route = None
        self._probs = None
        self.hidden_shape = None

    def _routing(self, x, probs, routing):
        """Checks the inputs; returns (topk indices [T,k] int64, probs [T,k] or None)."""
        comm = self.comm
        if routing is None:
            raise invalid("fusco dispatch: needs topk indices [T, k] or a routing map [T, E]")
        comm.check_tensor(routing, "routing_map/indices")
        if probs is not None:
            comm.check_tensor(probs, "probs")
            if not probs.is_floating_point():
                raise invalid("fusco dispatch: probs have dtype %s, not a float" % probs.dtype)
        num_tokens = x.shape[0]
        if routing.dtype == torch.bool:
            if tuple(routing.shape) != (num_tokens, self.num_experts):
                raise invalid("fusco dispatch: routing_map has shape %s, expected [%d, %d]"
                              % (tuple(routing.shape), num_tokens, self.num_experts))
            idx = _routing_map_to_topk(routing)
            if probs is not None:
                if tuple(probs.shape) != (num_tokens, self.num_experts):
                    raise invalid("fusco dispatch: with a routing_map, probs must be [%d, %d] "
                                  "(got %s)" % (num_tokens, self.num_experts, tuple(probs.shape)))
                picked = probs.gather(1, idx.clamp(min=0))
                probs = torch.where(idx >= 0, picked, torch.zeros_like(picked))
            return idx, probs
        if routing.dtype not in (torch.int64, torch.int32) or routing.dim() != 2 or \
                routing.shape[0] != num_tokens or routing.shape[1] < 1:
            raise invalid("fusco dispatch: indices must be int64 [%d, k>=1] (or a bool routing "
                          "map), got %s %s" % (num_tokens, routing.dtype, tuple(routing.shape)))
        if probs is not None and tuple(probs.shape) != tuple(routing.shape):
            raise invalid("fusco dispatch: probs have shape %s, indices %s"
                          % (tuple(probs.shape), tuple(routing.shape)))
        return routing.to(torch.int64).contiguous(), probs

    def dispatch(self, hidden_states, probs=None, routing_map=None, *, indices=None):
        """hidden_states [..., H]; probs [T, k] (with indices) or [T, E] (with a routing map),
        or None (combine then sums with weight 1); routing_map: bool [T, E], or int64 topk
        indices [T, k] (-1: unused slot), also accepted as indices=.
        Returns (tokens [numRecvRows, H] expert-major, tokens_per_expert: int64 CPU tensor with
        one count per local expert). Collective."""
        if routing_map is None:
            routing_map = indices
        try:
            self.comm.check_tensor(hidden_states, "hidden_states")
            if hidden_states.dim() < 1:
                raise invalid("fusco dispatch: hidden_states needs a hidden dimension")
            x = hidden_states.reshape(-1, hidden_states.shape[-1]) if hidden_states.dim() != 2 \
                else hidden_states
            idx, probs_k = self._routing(x, probs, routing_map)
        except FuscoError as e:
            if self.comm._handle is None:
                raise
            Route.fail_plan(self.comm, self._cfg, e)
        slot_map = probs_k is not None or x.dtype not in _COMBINE_TYPES
        route = Route(self.comm, self._cfg, idx, self._expert_rank, self.num_local_experts,
                      self.expert_alignment, slot_map)
        tokens = _Dispatch.apply(x, route)
        self.route, self._probs, self.hidden_shape = route, probs_k, hidden_states.shape
        return tokens, route.rows_per_expert.clone()

    def combine(self, expert_output):
        """expert_output [numRecvRows, H'] (the dispatch's row order) -> [..., H'] in the shape of
        the dispatched hidden_states, weighted by the dispatch's probs. Collective."""
        if self.route is None:
            raise FuscoError(_lib.INVALID_USAGE, "fusco combine: called before dispatch")
        out = _Combine.apply(expert_output, self._probs, self.route)
        if expert_output.dim() == 2:
            return out.view(tuple(self.hidden_shape[:-1]) + (expert_output.shape[1],))
        return out

    # Megatron's method names (MoETokenDispatcher).
    def token_permutation(self, hidden_states, probs, routing_map):
        return self.dispatch(hidden_states, probs, routing_map)

    def token_unpermutation(self, hidden_states, bias=None):
        if bias is not None:
            raise invalid("fusco.MoEDispatcher: a bias in token_unpermutation is not supported")
        return self.combine(hidden_states), None

    @property
    def tokens_per_expert(self):
        """Rows per local expert of the last dispatch before padding (CPU int64)."""
        return None if self.route is None else self.route.tokens_per_expert.clone()

    @property
    def num_recv_rows(self):
        return None if self.route is None else self.route.num_recv_rows
