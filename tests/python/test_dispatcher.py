"""fusco.MoEDispatcher against the pure-PyTorch Megatron reference (permute -> all_to_all_single ->
sort_chunks, fusco.reference): dispatched rows (bitwise), tokens_per_expert, combine, and the
gradients with respect to the hidden states, the router probabilities and the expert weights."""
import pytest
import torch

from harness import DEVICES, fusco, run_ranks
from fusco.reference import ReferenceDispatcher

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
       torch.bfloat16: dict(rtol=3e-2, atol=3e-2), torch.float16: dict(rtol=3e-3, atol=3e-3)}


class Case:
    def __init__(self, nranks, experts, topk, tokens, hidden, dtype=torch.float32, form="indices",
                 placement=None, holes=False, probs=True, hidden_out=None, dedup="auto",
                 one_expert=False, shape3d=False, alignment=0):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.hidden_out = hidden_out or hidden

    def __repr__(self):
        return "%dr-E%d-k%d-%s-%s%s%s" % (self.nranks, self.experts, self.topk,
                                          str(self.dtype).split(".")[-1], self.form,
                                          "-holes" if self.holes else "",
                                          "" if self.probs else "-noprobs")


def make_inputs(r, c, seed):
    """This rank's tokens, routing, probabilities, loss weights; all experts' weights."""
    g = r.gen(seed)
    T = c.tokens[r.rank]
    x = torch.randn(T, c.hidden, generator=g, dtype=torch.float64).to(c.dtype)
    if c.one_expert:
        idx = torch.zeros((T, c.topk), dtype=torch.int64)
    else:
        idx = torch.stack([torch.randperm(c.experts, generator=g)[:c.topk] for _ in range(T)]) \
            if T else torch.zeros((0, c.topk), dtype=torch.int64)
    if c.holes and T:
        holes = torch.rand(T, c.topk, generator=g) < 0.3
        holes[0, 0] = True
        idx[holes] = -1
    pdtype = torch.float64 if c.dtype == torch.float64 else torch.float32
    probs = torch.softmax(torch.randn(T, c.topk, generator=g, dtype=torch.float64), -1).to(pdtype)
    probs = torch.where(idx >= 0, probs, torch.zeros_like(probs))
    dense = torch.zeros((T, c.experts), dtype=pdtype)
    for t in range(T):
        for k in range(c.topk):
            if idx[t, k] >= 0:
                dense[t, idx[t, k]] = probs[t, k]
    rmap = dense != 0
    if c.one_expert:
        rmap = torch.zeros((T, c.experts), dtype=torch.bool)
        rmap[:, 0] = True
    loss_w = torch.randn(T, c.hidden_out, generator=torch.Generator().manual_seed(seed + r.rank))
    wg = torch.Generator().manual_seed(seed)  # the same expert weights on every rank
    weights = torch.randn(c.experts, c.hidden, c.hidden_out, generator=wg,
                          dtype=torch.float64) * 0.5
    wdtype = torch.float64 if c.dtype == torch.float64 else torch.float32
    dev = r.device
    return (x.to(dev), idx.to(dev), probs.to(dev), dense.to(dev), rmap.to(dev), loss_w.to(dev),
            weights.to(wdtype).to(dev))


def run_layer(r, c, disp, inputs):
    """dispatch -> per-expert tanh(x W_e) -> combine -> weighted sum; forward and backward."""
    x, idx, probs, dense, rmap, loss_w, weights = inputs
    x = x.clone().requires_grad_()
    local = disp.local_expert_indices
    w = weights[local].clone().requires_grad_()
    if c.form == "map":
        p = dense.clone().requires_grad_() if c.probs else None
        routing = rmap
    else:
        p = probs.clone().requires_grad_() if c.probs else None
        routing = idx
    xin = x.view(-1, 2, c.hidden) if c.shape3d else x
    tokens, tpe = disp.dispatch(xin, p, routing)
    assert tpe.dtype == torch.int64 and tpe.device.type == "cpu" and len(tpe) == len(local)
    assert tokens.shape == (int(tpe.sum()), c.hidden) and tokens.dtype == c.dtype
    chunks = torch.split(tokens, tpe.tolist())
    outs = [torch.tanh(ch.to(w.dtype) @ w[i]).to(c.dtype) for i, ch in enumerate(chunks)]
    expert_out = torch.cat(outs) if outs else tokens.new_zeros((0, c.hidden_out))
    out = disp.combine(expert_out)
    assert out.shape == tuple(xin.shape[:-1]) + (c.hidden_out,) and out.dtype == c.dtype
    out = out.reshape(-1, c.hidden_out)
    (out.to(loss_w.dtype) * loss_w).sum().backward()
    return dict(tokens=tokens.detach(), tpe=tpe, out=out.detach(), gx=x.grad, gw=w.grad,
                gp=p.grad if p is not None else None)


def close(name, a, b, dtype, rank):
    a, b = a.cpu().to(torch.float64), b.cpu().to(torch.float64)
    assert a.shape == b.shape, "%s: shapes %s vs %s" % (name, a.shape, b.shape)
    tol = TOL[dtype]
    if not torch.allclose(a, b, **tol):
        diff = (a - b).abs().max().item()
        raise AssertionError("rank %d: %s differs from the reference by %g (%s)\nfusco:\n%s\n"
                             "reference:\n%s" % (rank, name, diff, tol, a, b))


def _compare(r, c, seed):
    inputs = make_inputs(r, c, seed)
    disp = fusco.MoEDispatcher(r.comm, c.experts, c.placement, dedup=c.dedup)
    ref = ReferenceDispatcher(c.experts, c.placement)
    assert disp.local_expert_indices == ref.local_expert_indices
    got = run_layer(r, c, disp, inputs)
    want = run_layer(r, c, ref, inputs)
    assert torch.equal(got["tpe"], want["tpe"]), (got["tpe"], want["tpe"])
    assert torch.equal(got["tokens"].cpu(), want["tokens"].cpu()), "rank %d: dispatched rows " \
        "differ\nfusco:\n%s\nreference:\n%s" % (r.rank, got["tokens"], want["tokens"])
    assert torch.equal(disp.tokens_per_expert, want["tpe"])
    close("combine output", got["out"], want["out"], c.dtype, r.rank)
    close("grad hidden_states", got["gx"], want["gx"], c.dtype, r.rank)
    close("grad expert weights", got["gw"], want["gw"], c.dtype, r.rank)
    if c.probs:
        close("grad probs", got["gp"], want["gp"], c.dtype, r.rank)


CASES = [
    Case(2, 4, 2, [5, 7], 8, holes=True),
    Case(4, 8, 3, [0, 4, 8, 4], 6, form="map", hidden_out=5, shape3d=True),
    Case(3, 5, 2, [4, 6, 3], 5, placement=[2, 0, 1, 0, 2], holes=True),
    Case(2, 4, 2, [6, 6], 16, dtype=torch.bfloat16),
    Case(4, 8, 2, [5, 1, 7, 3], 12, dtype=torch.float16, holes=True, form="map"),
    Case(3, 6, 2, [4, 5, 6], 4, dtype=torch.float64, holes=True),
    Case(2, 4, 3, [5, 6], 8, holes=True, probs=False),
    Case(4, 4, 1, [6, 6, 6, 6], 3, one_expert=True),
    Case(3, 6, 4, [9, 2, 5], 7, dedup="none", holes=True),
    Case(4, 16, 8, [6, 3, 0, 5], 5, holes=True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_matches_megatron_reference(device, case):
    run_ranks(case.nranks, _compare, case, 1234, device=device)


def _dedup_modes_agree(r):
    c = Case(3, 6, 3, [7, 4, 6], 9, holes=True)
    inputs = make_inputs(r, c, 77)
    res = []
    for dedup in ("none", "rank", "auto"):
        disp = fusco.MoEDispatcher(r.comm, c.experts, dedup=dedup)
        res.append(run_layer(r, c, disp, inputs))
    for other in res[1:]:
        for key in ("tokens", "out", "gx", "gw", "gp"):
            assert torch.equal(res[0][key], other[key]), key


def test_dedup_modes_give_identical_bits():
    run_ranks(3, _dedup_modes_agree)


def _aligned(r):
    """expert_alignment pads each expert's block with zero rows: the real rows, the result and
    the gradients are those of the unpadded reference; padded rows get zero gradient."""
    c = Case(2, 4, 2, [7, 5], 6, holes=True)
    x, idx, probs, _, _, _, _ = make_inputs(r, c, 5)
    disp = fusco.MoEDispatcher(r.comm, c.experts, expert_alignment=4)
    ref = ReferenceDispatcher(c.experts)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ps = [probs.clone().requires_grad_() for _ in range(2)]
    tokens, rows = disp.dispatch(xs[0], ps[0], idx)
    rtokens, real = ref.dispatch(xs[1], ps[1], idx)
    assert torch.equal(disp.tokens_per_expert, real)
    assert torch.equal(rows, (real + 3) // 4 * 4)
    keep = torch.cat([torch.arange(int(n)) + int(rows[:i].sum()) for i, n in enumerate(real)]) \
        if len(real) else torch.zeros(0, dtype=torch.int64)
    pad = torch.ones(tokens.shape[0], dtype=torch.bool)
    pad[keep] = False
    assert torch.equal(tokens[keep], rtokens) and not tokens[pad].any()
    eo = (tokens * 2 + 1).detach().requires_grad_()  # padding rows hold 1: must be ignored
    out = disp.combine(eo)
    reo = (rtokens * 2 + 1).detach().requires_grad_()
    rout = ref.combine(reo)
    close("aligned combine", out.detach(), rout.detach(), c.dtype, r.rank)
    g = torch.randn(out.shape, generator=r.gen(3))
    out.backward(g)
    rout.backward(g)
    close("aligned grad expert", eo.grad[keep], reo.grad, c.dtype, r.rank)
    assert not eo.grad[pad].any()
    close("aligned grad probs", ps[0].grad, ps[1].grad, c.dtype, r.rank)
    (tokens * torch.arange(tokens.numel()).view_as(tokens)).sum().backward()
    (rtokens * torch.arange(tokens.numel()).view_as(tokens)[keep]).sum().backward()
    close("aligned grad x", xs[0].grad, xs[1].grad, c.dtype, r.rank)


def test_expert_alignment_pads_blocks_with_zero_rows():
    run_ranks(2, _aligned)


def _two_batches_in_flight(r):
    """A second dispatch before the first batch's backward: each graph keeps its own plan."""
    c = Case(2, 4, 2, [5, 3], 4, holes=True)
    disp = fusco.MoEDispatcher(r.comm, c.experts)
    ref = ReferenceDispatcher(c.experts)
    losses = {}
    for name, d in (("fusco", disp), ("ref", ref)):
        grads = []
        pending = []
        for seed in (1, 2):
            x, idx, probs, _, _, lw, _ = make_inputs(r, c, seed)
            x.requires_grad_()
            tokens, _ = d.dispatch(x, probs, idx)
            out = d.combine(torch.sin(tokens))
            pending.append(((out * lw).sum(), x))
        for loss, x in pending:
            loss.backward()
            grads.append(x.grad)
        losses[name] = grads
    for a, b in zip(losses["fusco"], losses["ref"]):
        close("grad x of an older batch", a, b, torch.float32, r.rank)


def test_older_graph_backward_after_new_dispatch():
    run_ranks(2, _two_batches_in_flight)


def _megatron_names(r):
    disp = fusco.MoEDispatcher(r.comm, 4)
    x = torch.randn(3, 2, 4, generator=r.gen(1))  # [seq, batch, hidden]
    rmap = torch.zeros(6, 4, dtype=torch.bool)
    rmap[torch.arange(6), torch.arange(6) % 4] = True
    probs = torch.rand(6, 4, generator=r.gen(2))
    tokens, tpe = disp.token_permutation(x, probs, rmap)
    out, bias = disp.token_unpermutation(tokens)
    assert bias is None and out.shape == x.shape
    p = probs[rmap].view(6, 1)
    assert torch.allclose(out.view(6, 4), x.view(6, 4) * p)
    with pytest.raises(fusco.FuscoError, match="bias"):
        disp.token_unpermutation(tokens, bias=torch.zeros(4))


def test_megatron_method_names_and_shapes():
    run_ranks(2, _megatron_names)
