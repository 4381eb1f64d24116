"""DeepEP's normal (high-throughput) mode on fusco: layout, dispatch (fresh and cached) and
combine, in DeepEP's receive layout: one row per (token, destination rank), grouped by source rank
ascending, tokens ascending within a source.

A dispatch is one count exchange (every rank's tokens per rank and per expert, which also gives
DeepEP's rank_prefix_matrix) and one fusco group that moves x (or the FP8 rows and their scales),
the routing and the source token indices with the same row lists. A combine is one fusco group that
returns every received row to its source, into a buffer of the rows that source sent, and a sum
over the ranks in rank order, in fp32: bitwise repeatable. Memory is proportional to the rows
moved; nothing loops over rows in Python.
"""
import torch

from .._rows import exchange
from .exchange import all_gather_rows


def check_topk(topk_idx, what):
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2:
        raise ValueError("deep_ep.%s: topk_idx must be a [tokens, topk] tensor" % what)
    if topk_idx.dtype != torch.int64:
        raise ValueError("deep_ep.%s: topk_idx must be int64 (deep_ep.topk_idx_t), got %s"
                         % (what, topk_idx.dtype))


def dispatch_layout(topk_idx, num_experts, nranks):
    """(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32,
    is_token_in_rank [T, R] bool): local, no communication. Experts are placed in contiguous
    blocks of num_experts / R per rank; -1 selects nothing."""
    check_topk(topk_idx, "get_dispatch_layout")
    if num_experts % nranks != 0:
        raise ValueError("deep_ep.get_dispatch_layout: num_experts (%d) must be a multiple of the "
                         "ranks (%d)" % (num_experts, nranks))
    valid = topk_idx >= 0
    if bool((topk_idx >= num_experts).any()) or bool((topk_idx < -1).any()):
        raise ValueError("deep_ep.get_dispatch_layout: topk_idx holds an id outside [-1, %d)"
                         % num_experts)
    ids = topk_idx[valid]
    per_expert = torch.bincount(ids, minlength=num_experts).to(torch.int32)
    t = topk_idx.shape[0]
    in_rank = torch.zeros((t, nranks), dtype=torch.bool, device=topk_idx.device)
    rows = torch.arange(t, device=topk_idx.device).unsqueeze(1).expand_as(topk_idx)[valid]
    in_rank[rows, ids // (num_experts // nranks)] = True
    per_rank = in_rank.sum(0, dtype=torch.int32)
    return per_rank, None, per_expert, in_rank


class Plan:
    """Who sends which rows where, from the count exchange (the state a DeepEP handle carries)."""

    def __init__(self, comm, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert):
        n, me = comm.nranks, comm.rank
        dev = is_token_in_rank.device
        row = torch.cat([num_tokens_per_rank.to(torch.int64),
                         num_tokens_per_expert.to(torch.int64)])
        allc = all_gather_rows(comm, row, "deep_ep.dispatch (counts)")
        self.rank_prefix_matrix = allc[:, :n].cumsum(0).to(torch.int32)
        e = num_tokens_per_expert.numel()
        self.num_local = e // n
        local = allc[:, n + me * self.num_local: n + (me + 1) * self.num_local]
        self.recv_per_expert = local.sum(0)
        self.recv_splits = [int(v) for v in allc[:, me].tolist()]
        self.send_splits = [int(v) for v in num_tokens_per_rank.tolist()]
        # Tokens for peer 0 ascending, then peer 1, ...: the transposed mask's nonzeros, in order.
        self.send_rows = is_token_in_rank.t().nonzero()[:, 1].contiguous()
        self.num_recv = sum(self.recv_splits)
        self.recv_rows = torch.arange(self.num_recv, dtype=torch.int64, device=dev)
        self.is_token_in_rank = is_token_in_rank

    def handle(self, recv_src_idx):
        """DeepEP's 6-tuple positions: [0] rank_prefix_matrix [R, R] int32 (inclusive over source
        ranks); [3] recv_src_idx; [4] is_token_in_rank; the others hold this plan."""
        return (self.rank_prefix_matrix, self, None, recv_src_idx, self.is_token_in_rank, None)


def _rows_like(t, nrows):
    return torch.empty((nrows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)


def _localise(plan, rank, recv_idx, recv_w):
    lo = rank * plan.num_local
    local = recv_idx - lo
    off = (recv_idx < lo) | (recv_idx >= lo + plan.num_local) | (recv_idx < 0)
    local[off] = -1
    if recv_w is not None:
        recv_w[off] = 0
    return local, recv_w


def run_dispatch(comm, plan, xs, topk_idx, topk_weights, rows_out):
    """Moves xs (a list of [T, ...] tensors) and, with topk_idx, the routing and the token indices.
    Returns (received xs, recv_topk_idx, recv_topk_weights, recv_src_idx); rows_out >= num_recv
    rows are allocated (padding: -1 ids, zero weights, rows left as allocated)."""
    dev = plan.recv_rows.device
    moves = [(x.contiguous(), _rows_like(x, rows_out)) for x in xs]
    t = xs[0].shape[0]
    tokens = torch.arange(t, dtype=torch.int64, device=dev).unsqueeze(1)
    src = torch.full((rows_out, 1), -1, dtype=torch.int64, device=dev)
    moves.append((tokens, src))
    recv_idx = recv_w = None
    if topk_idx is not None:
        recv_idx = torch.full((rows_out, topk_idx.shape[1]), -1, dtype=torch.int64, device=dev)
        moves.append((topk_idx.contiguous(), recv_idx))
        if topk_weights is not None:
            recv_w = torch.zeros((rows_out, topk_idx.shape[1]), dtype=torch.float32, device=dev)
            moves.append((topk_weights.to(torch.float32).contiguous(), recv_w))
    exchange(comm, moves, plan.send_rows, plan.send_splits, plan.recv_rows, plan.recv_splits,
             "deep_ep.dispatch")
    if recv_idx is not None:
        recv_idx, recv_w = _localise(plan, comm.rank, recv_idx, recv_w)
    return [m[1] for m in moves[:len(xs)]], recv_idx, recv_w, src[:, 0].to(torch.int32)


def run_combine(comm, plan, x, topk_weights, bias):
    """Every received row back to its source, summed there over the ranks in rank order (fp32).
    Returns (combined [T, ...] in x's dtype, combined weights [T, k] fp32 or None)."""
    if x.shape[0] != plan.num_recv:
        raise ValueError("deep_ep.combine: x has %d rows, the dispatch of this handle received %d"
                         % (x.shape[0], plan.num_recv))
    dev = x.device
    nsend = plan.send_rows.numel()
    back = torch.arange(nsend, dtype=torch.int64, device=dev)
    staged = _rows_like(x, nsend)
    moves = [(x.contiguous(), staged)]
    staged_w = None
    if topk_weights is not None:
        staged_w = torch.empty((nsend, topk_weights.shape[1]), dtype=torch.float32, device=dev)
        moves.append((topk_weights.to(torch.float32).contiguous(), staged_w))
    exchange(comm, moves, plan.recv_rows, plan.recv_splits, back, plan.send_splits,
             "deep_ep.combine")
    t = plan.is_token_in_rank.shape[0]
    out = torch.zeros((t,) + tuple(x.shape[1:]), dtype=torch.float32, device=dev)
    out_w = None if staged_w is None else torch.zeros((t, staged_w.shape[1]),
                                                      dtype=torch.float32, device=dev)
    start = 0
    for p in range(comm.nranks):  # one step per rank, never per row; unique tokens in each
        stop = start + plan.send_splits[p]
        tok = plan.send_rows[start:stop]
        out.index_add_(0, tok, staged[start:stop].to(torch.float32))
        if out_w is not None:
            out_w.index_add_(0, tok, staged_w[start:stop])
        start = stop
    for b in bias:
        out += b.to(torch.float32)
    return out.to(x.dtype), out_w
