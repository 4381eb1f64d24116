"""The DeepEP calls each MoE framework makes, with its exact keyword sets and no framework
imported (4 forked ranks, gloo groups; the CUDA variants skip without a GPU): Megatron-LM's fused
dispatch and combine, forward and backward, with async_finish and allocate_on_comm_stream;
vLLM's high-throughput and low-latency all2all managers; SGLang's normal mode with the FP8 tuple
and expert_alignment=128, and its low-latency mode after clean_low_latency_buffer. Every result is
checked against plain torch; the flags fusco cannot honour are refused by name.
"""
import os

import pytest
import torch
import torch.distributed as dist

import deepep_checks as ck
from harness import DEVICES, run_ranks

T, H, E, K, R = 48, 256, 16, 4, 4


def _setup(r, seed, device):
    os.environ["FUSCO_DEEP_EP_DEVICE"] = device
    g = r.gen(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    topk_idx = ck.routing(g, T, E, K)
    probs = torch.rand(T, K, generator=g)
    return ck.deep_ep(), ck.deep_ep_utils(), x, topk_idx, probs


def _in_rank(topk_idx, nranks):
    m = torch.zeros(T, nranks, dtype=torch.bool)
    m[torch.arange(T).unsqueeze(1).expand_as(topk_idx), topk_idx // (E // nranks)] = True
    return m


def _rank_sum(rows_of_rank, in_rank):
    """What a combine returns: sum over ranks (ascending) of the rows each returned, fp32."""
    acc = torch.zeros(T, H, dtype=torch.float32)
    for p, rows in enumerate(rows_of_rank):
        acc[in_rank[:, p]] += rows[in_rank[:, p]].float()
    return acc.to(torch.bfloat16)


def _megatron_body(r, seed, device):
    deep_ep, utils, x, topk_idx, probs = _setup(r, seed, device)
    dev = r.device
    buf = deep_ep.Buffer(dist.group.WORLD, int(2e8), 0)
    deep_ep.Buffer.set_num_sms(20)
    # FusedDispatch.forward
    previous_event = utils.EventOverlap(utils.EventHandle())
    per_rank, per_rdma, per_expert, in_rank, previous_event = buf.get_dispatch_layout(
        topk_idx.to(dev), E, previous_event=previous_event, async_finish=True,
        allocate_on_comm_stream=True)
    recv_x, recv_idx, recv_probs, counts, handle, after = buf.dispatch(
        x.to(dev), topk_idx=topk_idx.to(dev), topk_weights=probs.float().to(dev),
        num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        previous_event=previous_event, async_finish=True, allocate_on_comm_stream=True)
    after.current_stream_wait()
    ref_in = _in_rank(topk_idx, r.nranks)
    # FusedCombine.forward (expert outputs: the rows times (rank + 1))
    y = (recv_x.float() * (r.rank + 1)).to(torch.bfloat16)
    combined, _, after = buf.combine(y, handle=handle, async_finish=True,
                                     previous_event=utils.EventOverlap(utils.EventHandle()),
                                     allocate_on_comm_stream=True)
    after.current_stream_wait()
    want = _rank_sum([(x.float() * (p + 1)).to(torch.bfloat16) for p in range(r.nranks)], ref_in)
    assert torch.equal(combined.cpu().view(torch.int16), want.view(torch.int16))
    # FusedCombine.backward: the gradient dispatched again through the cached handle
    grad_x, _, _, _, _, after = buf.dispatch(combined.contiguous(), handle=handle,
                                             previous_event=utils.EventOverlap(
                                                 utils.EventHandle()),
                                             async_finish=True, allocate_on_comm_stream=True)
    after.current_stream_wait()
    assert grad_x.shape == recv_x.shape
    # FusedDispatch.backward: the rows' gradients and the probs' back to their tokens
    grad_in, grad_probs, after = buf.combine(
        grad_x.contiguous(), handle, topk_weights=recv_probs.float(),
        previous_event=utils.EventOverlap(utils.EventHandle()), async_finish=True,
        allocate_on_comm_stream=True)
    after.current_stream_wait()
    counts_per_token = ref_in.sum(1, dtype=torch.float32).unsqueeze(1)
    want_in = _rank_sum([combined.cpu()] * r.nranks, ref_in)
    assert torch.equal(grad_in.cpu().view(torch.int16), want_in.view(torch.int16))
    assert torch.equal(grad_probs.cpu(), probs.float())
    assert counts_per_token.min() >= 1
    return ck.digest(grad_in.cpu())


def _vllm_ht_body(r, seed, device):
    deep_ep, _, x, topk_idx, probs = _setup(r, seed, device)
    dev = r.device
    buf = deep_ep.Buffer(group=dist.group.WORLD, num_nvl_bytes=1024 << 20, num_rdma_bytes=0,
                         low_latency_mode=False, num_qps_per_rank=10, explicitly_destroy=True)
    deep_ep.Buffer.set_num_sms(20)
    available = [2, 4, 8, 16, 24, 32, 64, 128, 144, 160]
    cfg = deep_ep.Buffer.get_dispatch_config(r.nranks) if r.nranks in available else None
    ccfg = deep_ep.Buffer.get_combine_config(r.nranks) if r.nranks in available else None
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(
        topk_idx=topk_idx.to(dev), num_experts=E, previous_event=None, async_finish=False,
        allocate_on_comm_stream=False)
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x=x.to(dev), topk_idx=topk_idx.to(dev), topk_weights=probs.to(dev),
        num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, expert_alignment=1,
        config=cfg, previous_event=None, async_finish=False, allocate_on_comm_stream=False)
    # vLLM weights and reduces over the local experts itself, then combines without weights.
    w_local = recv_w.float().sum(1, keepdim=True)
    y = (recv_x.float() * w_local).to(torch.bfloat16)
    out, _, _ = buf.combine(x=y, handle=handle, topk_weights=None, config=ccfg,
                            previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False)
    want = x.float() * probs.sum(1, keepdim=True)
    assert ck.calc_diff(out.cpu().float(), want) < 1e-4
    buf.destroy()
    return ck.digest(out.cpu())


def _vllm_ll_body(r, seed, device):
    deep_ep, _, x, topk_idx, probs = _setup(r, seed, device)
    dev, el = r.device, E // r.nranks
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank=T, hidden=H, num_ranks=r.nranks, num_experts=E)
    buf = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=0, num_rdma_bytes=hint,
                         low_latency_mode=True, num_qps_per_rank=el,
                         allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                         explicitly_destroy=True, enable_shrink=False)
    recv, expert_num_tokens, handle, _, hook = buf.low_latency_dispatch(
        x.to(dev), topk_idx.to(dev), T, E, use_fp8=False, round_scale=False, use_ue8m0=False,
        async_finish=False, return_recv_hook=True)
    hook()
    assert int(expert_num_tokens.sum()) == int((ck.all_gather(topk_idx) // el == r.rank).sum())
    output = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
    _, _, hook = buf.low_latency_combine(recv, topk_idx.to(dev), probs.to(dev), handle,
                                         async_finish=False, zero_copy=False,
                                         return_recv_hook=True, out=output)
    hook()
    assert ck.calc_diff(output.cpu().float(), x.float() * probs.sum(1, keepdim=True)) < 1e-5
    with pytest.raises(NotImplementedError, match="use_logfmt"):
        buf.low_latency_combine(recv, topk_idx.to(dev), probs.to(dev), handle, use_logfmt=True)
    buf.destroy()
    return ck.digest(output.cpu())


def _sglang_body(r, seed, device):
    deep_ep, _, x, topk_idx, probs = _setup(r, seed, device)
    dev, el = r.device, E // r.nranks
    cfg = deep_ep.Config(**{"num_sms": deep_ep.Buffer.num_sms,
                            "num_max_nvl_chunked_send_tokens": 8,
                            "num_max_nvl_chunked_recv_tokens": 256,
                            "num_max_rdma_chunked_send_tokens": 6,
                            "num_max_rdma_chunked_recv_tokens": 128})
    nvl = cfg.get_nvl_buffer_size_hint(H * 2, r.nranks)
    buf = deep_ep.Buffer(dist.group.WORLD, nvl, 0, low_latency_mode=False, num_qps_per_rank=1,
                         allow_mnnvl=True)
    assert (buf.group_size, buf.low_latency_mode) == (r.nranks, False)
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx.to(dev), E)
    fp8 = tuple(t.to(dev) for t in ck.per_token_cast_to_fp8(x))
    recv, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        fp8, topk_idx=topk_idx.to(dev), topk_weights=probs.to(dev),
        num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, expert_alignment=128,
        config=cfg)
    assert all(c % 128 == 0 for c in counts) and len(counts) == el
    local = (ck.all_gather(topk_idx) // el == r.rank)
    assert sum(counts) >= int(local.sum())
    y = ck.per_token_cast_back(recv[0].cpu(), recv[1].cpu()).to(torch.bfloat16).to(dev)
    out, _, _ = buf.combine(y, handle, config=cfg)
    want = ck.per_token_cast_back(*ck.per_token_cast_to_fp8(x)) * \
        _in_rank(topk_idx, r.nranks).sum(1, keepdim=True)
    assert ck.calc_diff(out.cpu().float(), want) < 1e-4
    # AUTO mode: the same process switches to low latency.
    buf.clean_low_latency_buffer(T, H, E)
    ll = deep_ep.Buffer(dist.group.WORLD, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(
        T, H, r.nranks, E), low_latency_mode=True, num_qps_per_rank=el, allow_mnnvl=True)
    ll.clean_low_latency_buffer(T, H, E)
    recv, _, handle, event, _ = ll.low_latency_dispatch(x.to(dev), topk_idx.to(dev), T, E,
                                                        use_fp8=True, async_finish=True,
                                                        return_recv_hook=False)
    event.current_stream_wait()
    y = ck.per_token_cast_back(recv[0].cpu(), recv[1].cpu()).to(torch.bfloat16).to(dev)
    out, event, _ = ll.low_latency_combine(y, topk_idx.to(dev), probs.to(dev), handle,
                                           async_finish=True, return_recv_hook=False)
    event.current_stream_wait()
    assert ck.calc_diff(out.cpu().float(), x.float() * probs.sum(1, keepdim=True)) < 9e-4
    return ck.digest(out.cpu())


def _refusals_body(r, seed, device):
    deep_ep, _, x, topk_idx, _ = _setup(r, seed, device)
    with pytest.raises(NotImplementedError, match="enable_shrink"):
        deep_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True, enable_shrink=True)
    buf = deep_ep.Buffer(dist.group.WORLD, 0, 1 << 20, low_latency_mode=True,
                         explicitly_destroy=True, is_intranode=True)
    with pytest.raises(NotImplementedError, match="round_scale"):
        buf.low_latency_dispatch(x.to(r.device), topk_idx.to(r.device), T, E, use_fp8=True,
                                 round_scale=True, use_ue8m0=True)
    buf.destroy()
    return True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("body", [_megatron_body, _vllm_ht_body, _vllm_ll_body, _sglang_body,
                                  _refusals_body],
                         ids=["megatron", "vllm_ht", "vllm_ll", "sglang", "refusals"])
def test_framework_call_site(body, device):
    first = run_ranks(R, body, 11, device, device=device, comm=False)
    assert first == run_ranks(R, body, 11, device, device=device, comm=False)
