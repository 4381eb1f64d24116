"""A pure-PyTorch reference of Megatron's all-to-all token dispatcher (no fusco involved):
permute -> all_to_all_single -> sort_chunks_by_idxs, and back, with autograd through a
differentiable all-to-all. Same interface as fusco.MoEDispatcher, so tests and examples swap them.

Follows megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher) and
moe_utils.py (permute, unpermute, sort_chunks_by_idxs) with a routing map, generalized to any
expert placement: experts are ordered by (rank, id), so "local experts" are contiguous per rank.
"""
import torch
import torch.distributed as dist


def _wire(t):
    """The tensor that crosses gloo: bf16/fp16 travel as bytes (gloo has neither type)."""
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.uint8)
    return t


class _AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 whose backward is the reverse all-to-all (Megatron's)."""

    @staticmethod
    def forward(ctx, group, x, output_splits, input_splits):
        ctx.group, ctx.output_splits, ctx.input_splits = group, output_splits, input_splits
        x = x.contiguous()
        on_host = x.is_cuda and dist.get_backend(group) == "gloo"
        src = x.cpu() if on_host else x
        out = src.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(_wire(out), _wire(src), output_splits, input_splits, group=group)
        return out.to(x.device) if on_host else out

    @staticmethod
    def backward(ctx, grad):
        return (None, _AllToAll.apply(ctx.group, grad, ctx.input_splits, ctx.output_splits), None,
                None)


def _sort_chunks(x, split_sizes, order):
    chunks = torch.split(x, split_sizes, dim=0)
    return torch.cat([chunks[i] for i in order], dim=0)


class ReferenceDispatcher:
    """Megatron-style dispatcher over torch.distributed (e.g. gloo).

    dispatch(hidden_states, probs, routing_map | topk indices) and combine(expert_output) behave
    like fusco.MoEDispatcher's (same output row order, same tokens_per_expert); combine sums in
    fp32 and returns the expert output's dtype.
    """

    def __init__(self, num_experts, expert_to_rank=None, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.nranks = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        n = self.nranks
        if expert_to_rank is None:
            expert_to_rank = [e // (num_experts // n) for e in range(num_experts)]
        self.num_experts = num_experts
        self.expert_to_rank = [int(r) for r in expert_to_rank]
        # Experts in (rank, id) order; position i of this order is "expert slot" i.
        self.order = sorted(range(num_experts), key=lambda e: (self.expert_to_rank[e], e))
        self.experts_of = [[e for e in self.order if self.expert_to_rank[e] == r] for r in range(n)]
        self.local_expert_indices = self.experts_of[self.rank]
        self.num_local_experts = len(self.local_expert_indices)

    def _dense(self, x, probs, routing):
        """(routing_map [T,E] bool, probs [T,E] or None) from either routing form."""
        num_tokens = x.shape[0]
        if routing.dtype == torch.bool:
            return routing, probs
        idx = routing.to(torch.int64)
        valid = idx >= 0
        rmap = torch.zeros((num_tokens, self.num_experts), dtype=torch.bool, device=x.device)
        token = torch.arange(num_tokens, device=x.device).unsqueeze(1).expand_as(idx)
        rmap[token[valid], idx[valid]] = True
        dense = None
        if probs is not None:
            dense = torch.zeros((num_tokens, self.num_experts), dtype=probs.dtype,
                                device=x.device)
            dense = dense.scatter_add(1, idx.clamp(min=0),
                                      torch.where(valid, probs, torch.zeros_like(probs)))
        return rmap, dense

    def dispatch(self, hidden_states, probs=None, routing_map=None, *, indices=None):
        if routing_map is None:
            routing_map = indices
        self.hidden_shape = hidden_states.shape
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        rmap, dense = self._dense(x, probs, routing_map)
        rmap = rmap[:, self.order]  # columns in (rank, id) order
        n, num_local = self.nranks, self.num_local_experts
        # preprocess: counts per expert here, per (source rank, local expert) everywhere.
        local_counts = rmap.sum(0).to(torch.int64).cpu()
        gathered = [torch.zeros_like(local_counts) for _ in range(n)]
        dist.all_gather(gathered, local_counts, group=self.group)
        sizes = [len(self.experts_of[r]) for r in range(n)]
        first = sum(sizes[:self.rank])
        per_src = torch.stack(gathered)[:, first:first + num_local]  # [n, num_local]
        self.input_splits = [int(c.sum()) for c in torch.split(local_counts, sizes)]
        self.output_splits = per_src.sum(1).tolist()
        tokens_per_expert = per_src.sum(0)
        # permute: rows grouped by expert (in the order above), tokens ascending.
        num_tokens = x.shape[0]
        token_ids = torch.arange(num_tokens, device=x.device).unsqueeze(0).expand(
            rmap.shape[1], -1)
        self.sorted_indices = token_ids.masked_select(rmap.t().contiguous())
        permuted = x.index_select(0, self.sorted_indices)
        self.permuted_probs = None
        if dense is not None:
            dense = dense[:, self.order]
            self.permuted_probs = dense.t().contiguous().masked_select(rmap.t().contiguous())
        received = _AllToAll.apply(self.group, permuted, self.output_splits, self.input_splits)
        # sort_chunks_by_idxs: (source rank, local expert) -> (local expert, source rank)
        self.chunk_sizes = per_src.reshape(-1).tolist()
        self.sort_order = [s * num_local + e for e in range(num_local) for s in range(n)]
        self.restore_order = [e * n + s for s in range(n) for e in range(num_local)]
        self.sorted_sizes = [self.chunk_sizes[i] for i in self.sort_order]
        self.num_tokens = num_tokens
        tokens = _sort_chunks(received, self.chunk_sizes, self.sort_order)
        return tokens, tokens_per_expert

    def combine(self, expert_output):
        x = _sort_chunks(expert_output, self.sorted_sizes, self.restore_order)
        x = _AllToAll.apply(self.group, x, self.input_splits, self.output_splits)
        # unpermute: weight each row by its probability, scatter-add into its token (in fp32).
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        rows = x.to(acc)
        if self.permuted_probs is not None:
            rows = rows * self.permuted_probs.to(acc).unsqueeze(-1)
        out = torch.zeros((self.num_tokens, x.shape[1]), dtype=acc, device=x.device)
        out = out.scatter_add(0, self.sorted_indices.unsqueeze(1).expand(-1, x.shape[1]), rows)
        return out.to(expert_output.dtype).view(tuple(self.hidden_shape[:-1]) + (x.shape[1],))

    token_permutation = dispatch

    def token_unpermutation(self, hidden_states, bias=None):
        return self.combine(hidden_states), None
