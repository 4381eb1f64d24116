"""DeepEP compatibility: what DeepEP's own intranode and low-latency tests check, written afresh,
on 2, 4 and 8 forked ranks with gloo groups (CPU tensors; the CUDA variants skip without a GPU).
Only the deep_ep API is used (deepep_checks.MODULE: fusco.deep_ep, or DEEP_EP_MODULE=deep_ep for
real DeepEP), so the same file runs against DeepEP for a differential check.

Normal mode: the layout; the receive counts and per-expert list; every source's rows located
through handle[0] (rank_prefix_matrix); local expert ids and zeroed off-rank weights; cached
dispatch; num_worst_tokens; combine within DeepEP's tolerance and bitwise against a pure-torch
reference that sums every rank's returned row in rank order in fp32; the same bytes twice.
Low-latency mode: counts, layout_range and src_info in bf16 and FP8, with and without the receive
hook, both buffers; combine in bf16 and FP8 (plain, out= and zero_copy) within DeepEP's tolerance;
the same bytes twice.
"""
import os

import pytest
import torch
import torch.distributed as dist

import deepep_checks as ck
from harness import DEVICES, run_ranks

T, H, E, K = 64, 256, 16, 4
RANKS = [2, 4, 8]


def _use_device(device):
    os.environ["FUSCO_DEEP_EP_DEVICE"] = device


# ---------------------------------------------------------------- normal mode

def _inputs(r, seed):
    me = r.rank
    g = r.gen(seed)
    x_rank = (torch.ones(T, H) * me).to(torch.bfloat16)
    x_rand = torch.randn(T, H, generator=g).to(torch.bfloat16)
    topk_idx = ck.routing(g, T, E, K)
    w_rank = torch.ones(T, K) * me
    w_rand = torch.randn(T, K, generator=g)
    return x_rank, x_rand, topk_idx, w_rank, w_rand


def _reference_layout(topk_idx, nranks):
    el = E // nranks
    per_expert = torch.bincount(topk_idx.flatten(), minlength=E).to(torch.int32)
    in_rank = torch.zeros(T, nranks, dtype=torch.bool)
    in_rank[torch.arange(T).unsqueeze(1).expand_as(topk_idx), topk_idx // el] = True
    return in_rank.sum(0, dtype=torch.int32), per_expert, in_rank


def _check_layout(buf, topk_idx, nranks, dev):
    ref_rank, ref_expert, ref_in = _reference_layout(topk_idx, nranks)
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx.to(dev), E)
    assert torch.equal(per_rank.cpu(), ref_rank)
    assert torch.equal(per_expert.cpu(), ref_expert)
    assert torch.equal(in_rank.cpu(), ref_in)
    return per_rank, per_rdma, per_expert, in_rank


def _check_blocks(rows, prefix, me, nranks, want_of_source):
    """Rows [prefix[i-1][me], prefix[i][me]) came from source i: each equals want_of_source(i)."""
    start = 0
    for i in range(nranks):
        stop = int(prefix[i][me])
        block = rows[start:stop]
        if block.numel():
            assert torch.all(block == want_of_source(i)), "rows from source %d" % i
        start = stop


def _check_received(recv, ridx, rw, counts, handle, ctx):
    me, nranks, el = ctx["me"], ctx["nranks"], E // ctx["nranks"]
    assert recv.shape[0] == int(ctx["gbl_rank"][me])
    assert counts == ctx["gbl_expert"].view(nranks, -1)[me].tolist()
    prefix = handle[0].cpu()
    if ctx["constant"]:
        assert torch.all(recv.amax(1) == recv.amin(1)), "every received row is constant"
        _check_blocks(recv[:, 0], prefix, me, nranks, lambda i: float(i))
    if ridx is None:
        return
    ridx, rw = ridx.cpu(), rw.cpu()
    assert bool(((ridx == -1) | ((ridx >= 0) & (ridx < el))).all())
    for i in range(el):
        assert int((ridx == i).sum()) == counts[i]
    assert torch.all(rw[ridx == -1] == 0), "weights of slots on other ranks are zero"
    if ctx["constant"]:
        filled = rw.masked_fill(ridx == -1, float("-inf")).amax(1)
        _check_blocks(filled, prefix, me, nranks, lambda i: float(i))


def _reference_combine(xs_returned, in_rank):
    """sum over ranks p (ascending) of the row p returned, in fp32, then bf16."""
    acc = torch.zeros(T, H, dtype=torch.float32)
    for p, rows in enumerate(xs_returned):
        m = in_rank[:, p]
        acc[m] += rows[m].float()
    return acc.to(torch.bfloat16)


def _dispatch_case(buf, layout, cur, topk_idx, w, with_topk, prev, async_finish):
    per_rank, per_rdma, per_expert, in_rank = layout
    kw = dict(num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
              is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
              async_finish=async_finish)
    if with_topk:
        kw.update(topk_idx=topk_idx, topk_weights=w)
    if prev:
        kw["previous_event"] = buf.capture()
    out = buf.dispatch(cur, **kw)
    if async_finish:
        out[5].current_stream_wait()
    return out


def _normal_body(r, seed, device):
    _use_device(device)
    deep_ep = ck.deep_ep()
    me, nranks, dev = r.rank, r.nranks, r.device
    x_rank, x_rand, topk_idx, w_rank, w_rand = _inputs(r, seed)
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
    layout = _check_layout(buf, topk_idx, nranks, dev)
    in_rank = layout[3].cpu()
    ctx = dict(me=me, nranks=nranks,
               gbl_rank=ck.all_reduce(layout[0].cpu().to(torch.int64)),
               gbl_expert=ck.all_reduce(layout[2].cpu().to(torch.int64)))
    fp8 = ck.per_token_cast_to_fp8(x_rank)
    digests = []
    for prev in (False, True):
        for async_finish in (False, True):
            for name, cur, w in (("rand", x_rand, w_rand), ("rank", x_rank, w_rank),
                                 ("fp8", fp8, w_rank)):
                for with_topk in (False, True):
                    xin = tuple(t.to(dev) for t in cur) if name == "fp8" else cur.to(dev)
                    recv, ridx, rw, counts, handle, _ = _dispatch_case(
                        buf, layout, xin, topk_idx.to(dev), w.to(dev), with_topk, prev,
                        async_finish)
                    # FP8 rows decode to within an ulp of the source's value.
                    rx = ck.per_token_cast_back(recv[0].cpu(), recv[1].cpu()).round() \
                        if name == "fp8" else recv.cpu().float()
                    ctx["constant"] = name != "rand"
                    _check_received(rx, ridx, rw, counts, handle, ctx)
                    if name == "fp8":
                        continue
                    digests.append(_check_combine(buf, r, recv, rw, handle, cur, w, in_rank,
                                                  with_topk, async_finish))
    _check_cached_and_worst(buf, layout, x_rank.to(dev), topk_idx.to(dev), ctx)
    return digests


def _check_combine(buf, r, recv, rw, handle, cur, w, in_rank, with_topk, async_finish):
    """Each rank returns its received rows times (rank + 1) (in bf16), so the sum is not trivial."""
    me, nranks = r.rank, r.nranks
    back = (recv.float() * (me + 1)).to(torch.bfloat16)
    out, out_w, ev = buf.combine(back, handle, topk_weights=rw if with_topk else None,
                                 async_finish=async_finish)
    if async_finish:
        ev.current_stream_wait()
    out = out.cpu()
    ref = _reference_combine([(cur.float() * (p + 1)).to(torch.bfloat16) for p in range(nranks)],
                             in_rank)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), "combine is bitwise the ref"
    per_token = sum((in_rank[:, p].float() * (p + 1)) for p in range(nranks)).unsqueeze(1)
    assert ck.calc_diff(out.float() / per_token, cur.float()) < 5e-6
    if with_topk:
        assert torch.equal(out_w.cpu(), w.float()), "summed weights restore the routing weights"
    return ck.digest(out)


def _check_cached_and_worst(buf, layout, x, topk_idx, ctx):
    me, nranks = ctx["me"], ctx["nranks"]
    per_rank, per_rdma, per_expert, in_rank = layout
    first = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                         num_tokens_per_expert=per_expert, topk_idx=topk_idx,
                         topk_weights=torch.ones(topk_idx.shape, device=x.device))
    again = buf.dispatch(x, handle=first[4])
    assert again[1:5] == (None, None, None, None)
    assert torch.equal(again[0].cpu(), first[0].cpu()), "a cached dispatch moves the same rows"
    worst = T * nranks
    padded = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                          num_tokens_per_expert=per_expert, topk_idx=topk_idx,
                          topk_weights=torch.ones(topk_idx.shape, device=x.device),
                          num_worst_tokens=worst)
    n = first[0].shape[0]
    assert padded[0].shape[0] == worst and padded[3] == []
    assert torch.equal(padded[0][:n].cpu(), first[0].cpu())
    assert torch.equal(padded[1][:n].cpu(), first[1].cpu())
    assert bool((padded[1][n:] == -1).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nranks", RANKS)
def test_normal_mode_matches_deepep_semantics_and_is_deterministic(nranks, device):
    first = run_ranks(nranks, _normal_body, 5, device, device=device, comm=False)
    second = run_ranks(nranks, _normal_body, 5, device, device=device, comm=False)
    assert first == second, "the same inputs gave different bytes"


# ---------------------------------------------------------------- low-latency mode

def _ll_inputs(r, seed):
    me = r.rank
    g = r.gen(seed)
    x = torch.ones(T, H) * (me - 128)
    x[:, -128:] = torch.arange(T, dtype=torch.float32).view(-1, 1)
    x = x.to(torch.bfloat16)
    scores = torch.randn(T, E, generator=g).abs() + 1
    topk_idx = torch.topk(scores, K, dim=-1, largest=True, sorted=True).indices.to(torch.int64)
    drop = torch.randperm(T * K, generator=g)[:10]
    topk_idx.view(-1)[drop] = -1
    weights = torch.randn(T, K, generator=g).abs()
    return x, topk_idx, weights


def _check_ll_expert(e_local, recv, count, layout, src, stats, all_topk, ctx):
    me, nranks = ctx["me"], ctx["nranks"]
    el = E // nranks
    gid = me * el + e_local
    n = int(count[e_local])
    assert n == int(stats[e_local]) // ctx["calls"]
    assert n == int((layout[e_local] & 0xFFFFFFFF).sum())
    assert n == int((all_topk == gid).sum())
    rows = recv[e_local, :n]
    body = rows[:, :-128]
    assert torch.all(body.amin(1) == body.amax(1)), "each row is its source's constant"
    assert torch.all(rows[:, -128:] == (src[e_local, :n] % T).float().view(-1, 1))
    for j in range(nranks):
        begin, cnt = int(layout[e_local, j]) >> 32, int(layout[e_local, j]) & 0xFFFFFFFF
        assert cnt == int((all_topk[j] == gid).sum())
        assert int((body[:, 0] == j - 128).sum()) == cnt
        if cnt:
            assert torch.all(recv[e_local, begin:begin + cnt, 0] == j - 128)


def _ll_dispatch(buf, x, topk_idx, stats, use_fp8, hook):
    recv, count, handle, event, recv_hook = buf.low_latency_dispatch(
        x, topk_idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=use_fp8,
        async_finish=not hook, return_recv_hook=hook)
    if hook:
        recv_hook()
    else:
        event.current_stream_wait()
    if use_fp8:  # decoded within an ulp of the integers the rows hold
        return ck.per_token_cast_back(recv[0].cpu(), recv[1].cpu()), count, handle
    return recv.cpu().float(), count, handle


def _ll_combine(buf, gemm, topk_idx, weights, handle, zero_copy, hook, dev):
    if zero_copy:
        buf.get_next_low_latency_combine_buffer(handle)[:] = gemm
    out = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
    got, event, recv_hook = buf.low_latency_combine(
        gemm, topk_idx, weights, handle, zero_copy=zero_copy, async_finish=not hook,
        return_recv_hook=hook, out=out)
    assert got is out
    if hook:
        recv_hook()
    else:
        event.current_stream_wait()
    return out.cpu()


def _ll_body(r, seed, device):
    _use_device(device)
    deep_ep = ck.deep_ep()
    me, nranks, dev = r.rank, r.nranks, r.device
    el = E // nranks
    x, topk_idx, weights = _ll_inputs(r, seed)
    all_topk = ck.all_gather(topk_idx)
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, nranks, E)
    buf = deep_ep.Buffer(dist.group.WORLD, num_rdma_bytes=hint, low_latency_mode=True,
                         num_qps_per_rank=el, explicitly_destroy=True)
    stats = torch.zeros(el, dtype=torch.int32, device=dev)
    ctx = dict(me=me, nranks=nranks, calls=0)
    digests = []
    want = x.float() * weights.masked_fill(topk_idx == -1, 0).sum(1, keepdim=True)
    for hook in (False, True):
        for use_fp8 in (False, True):
            for _ in range(2):  # both halves of the buffer
                recv, count, handle = _ll_dispatch(buf, x.to(dev), topk_idx.to(dev), stats,
                                                   use_fp8, hook)
                ctx["calls"] += 1
                for e in range(el):
                    _check_ll_expert(e, recv.round(), count.cpu(), handle[1].cpu(),
                                     handle[0].cpu(), stats.cpu(), all_topk, ctx)
                gemm = recv.to(torch.bfloat16).to(dev)
                for zero_copy in (False, True):
                    out = _ll_combine(buf, gemm, topk_idx.to(dev), weights.to(dev), handle,
                                      zero_copy, hook, dev)
                    assert not torch.isnan(out.float()).any()
                    assert ck.calc_diff(out.float(), want) < (9e-4 if use_fp8 else 1e-5)
                    digests += [ck.digest(recv), ck.digest(out)]
    buf.destroy()
    return digests


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nranks", RANKS)
def test_low_latency_mode_matches_deepep_semantics_and_is_deterministic(nranks, device):
    first = run_ranks(nranks, _ll_body, 7, device, device=device, comm=False)
    second = run_ranks(nranks, _ll_body, 7, device, device=device, comm=False)
    assert first == second, "the same inputs gave different bytes"
