"""DeepEP's `Config` (its five keyword names and checks) and the buffer size hints."""


class Config:
    """Tuning of DeepEP's normal-mode kernels. fusco moves rows through its own engine, so the
    values are checked as DeepEP checks them and kept, and `num_sms` bounds nothing here; the size
    hints answer what a caller sizes DeepEP's buffers with (fusco allocates what it needs)."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6,
                 num_max_nvl_chunked_recv_tokens=256, num_max_rdma_chunked_send_tokens=6,
                 num_max_rdma_chunked_recv_tokens=256):
        if num_max_nvl_chunked_send_tokens >= num_max_nvl_chunked_recv_tokens:
            raise ValueError("deep_ep.Config: num_max_nvl_chunked_send_tokens (%d) must be below "
                             "num_max_nvl_chunked_recv_tokens (%d)"
                             % (num_max_nvl_chunked_send_tokens, num_max_nvl_chunked_recv_tokens))
        rdma_send = num_max_rdma_chunked_send_tokens
        if rdma_send <= 0:
            raise ValueError("deep_ep.Config: num_max_rdma_chunked_send_tokens must be positive")
        rdma_recv = -(-num_max_rdma_chunked_recv_tokens // rdma_send) * rdma_send
        if rdma_send > rdma_recv // 2:
            raise ValueError("deep_ep.Config: num_max_rdma_chunked_send_tokens (%d) must be at "
                             "most half of num_max_rdma_chunked_recv_tokens (%d, aligned)"
                             % (rdma_send, rdma_recv))
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = rdma_send
        self.num_max_rdma_chunked_recv_tokens = rdma_recv

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """Bytes of the rows in flight between the ranks of a node: every channel's receive window
        of every peer (DeepEP's sizing, 16-byte rows rounded)."""
        channels = max(1, self.num_sms // 2)
        row = -(-int(hidden_bytes) // 16) * 16
        return channels * int(num_ranks) * self.num_max_nvl_chunked_recv_tokens * row

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0 on one node of up to 8 ranks, as DeepEP; else the windows of the remote peers."""
        if int(num_ranks) <= 8:
            return 0
        channels = max(1, self.num_sms // 2)
        row = -(-int(hidden_bytes) // 16) * 16
        nodes = -(-int(num_ranks) // 8)
        return channels * nodes * self.num_max_rdma_chunked_recv_tokens * row * 2

    def __repr__(self):
        return ("deep_ep.Config(num_sms=%d, nvl %d/%d, rdma %d/%d)"
                % (self.num_sms, self.num_max_nvl_chunked_send_tokens,
                   self.num_max_nvl_chunked_recv_tokens, self.num_max_rdma_chunked_send_tokens,
                   self.num_max_rdma_chunked_recv_tokens))
