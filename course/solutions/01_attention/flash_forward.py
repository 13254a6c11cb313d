# Lesson 01, exercise 01-flash-forward: FlashAttention's forward, keys in blocks, online softmax.
import torch


def flash_forward(q, k, v, block_k=16):
    """q, k, v (B, H, N, d) -> (O (B, H, N, d), L (B, H, N)), L = logsumexp of each row's scaled scores."""
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"), device=q.device)  # running max of each query row
    l = torch.zeros(q.shape[:3], device=q.device)  # running sum of exp(s - m)  # noqa: E741 (the paper's l)
    acc = torch.zeros(q.shape, device=q.device)  # running sum of exp(s - m) · v
    for start in range(0, k.shape[2], block_k):
        kb, vb = k[:, :, start:start + block_k], v[:, :, start:start + block_k]  # the last block may be short
        s = (q @ kb.transpose(-2, -1)) * scale  # (B, H, N, block): one tile of scores
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)  # rescales what was summed under the old max (0 on the first block)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)  # noqa: E741
        acc = acc * alpha[..., None] + p @ vb
        m = m_new
    return acc / l[..., None], m + torch.log(l)
