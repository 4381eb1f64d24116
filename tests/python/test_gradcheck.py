"""torch.autograd.gradcheck of dispatch -> experts -> combine in float64 on several ranks.

fusco moves rows as bytes, so dispatch (and its backward's reverse movement) is exact in float64;
fuscoMoeCombine itself takes fp32/bf16/fp16 only, so float64 combines go through the dispatcher's
slot map (rows brought back with fusco.all_to_all, summed over k in float64). The fp32/bf16/fp16
path is checked against the reference in test_dispatcher.py.

Every rank has the same number of tokens, so gradcheck makes the same number of (collective)
forward and backward calls everywhere.
"""
import pytest
import torch

from harness import DEVICES, fusco, run_ranks


def _layer(disp, form):
    def f(x, probs, routing):
        tokens, _ = disp.dispatch(x, probs, routing)
        scale = torch.linspace(0.5, 1.5, tokens.numel(), dtype=tokens.dtype,
                               device=tokens.device).view_as(tokens)
        return disp.combine(torch.tanh(tokens) * scale + tokens * tokens)
    return f


def _gradcheck(r, form, with_probs):
    g = r.gen(21)
    T, H, E, k = 3, 3, 2 * r.nranks, 2
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    idx[1, 0] = -1  # an unused slot
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    probs = torch.rand(T, k, generator=g, dtype=torch.float64) + 0.1
    disp = fusco.MoEDispatcher(r.comm, E)
    if form == "map":
        rmap = torch.zeros(T, E, dtype=torch.bool)
        dense = torch.rand(T, E, generator=g, dtype=torch.float64)
        for t in range(T):
            for j in range(k):
                if idx[t, j] >= 0:
                    rmap[t, idx[t, j]] = True
        routing, probs = rmap, dense
    else:
        routing = idx
    x = x.to(r.device).requires_grad_()
    routing = routing.to(r.device)
    probs = probs.to(r.device).requires_grad_() if with_probs else None
    f = _layer(disp, form)
    if with_probs:
        assert torch.autograd.gradcheck(lambda a, b: f(a, b, routing), (x, probs))
    else:
        assert torch.autograd.gradcheck(lambda a: f(a, None, routing), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nranks,form,with_probs", [
    (2, "indices", True),
    (3, "map", True),
    (2, "indices", False),
])
def test_gradcheck_float64(device, nranks, form, with_probs):
    run_ranks(nranks, _gradcheck, form, with_probs, device=device)
