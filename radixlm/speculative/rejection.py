"""Rejection sampling of a draft with a distribution against the target's distributions.

Draft tokens d_1..d_k were drawn from q_1..q_k; p_1..p_{k+1} are the target's laws at the
same positions (`Sampler.distribution`: the request's temperature and cuts). Accept d_j
with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection emit a draw from
norm(max(0, p_j - q_j)) and stop; with all k accepted, emit `bonus`, a draw from p_{k+1}.
The emitted tokens then follow the target's law exactly, whatever q is (Leviathan et al.
2023; Chen et al. 2023). A point-mass draft (lookup drafters, greedy requests) is the case
the controller handles by comparing with the target's own draw. O(k) host work.
"""

from __future__ import annotations

import torch


def accept_with_probs(p: torch.Tensor, q: torch.Tensor, draft: list[int], bonus: int,
                      generator: torch.Generator | None) -> list[int]:
    """The emitted tokens: the accepted prefix of `draft`, then the residual's draw or
    `bonus`. p [>= k, V] (rows 0..k-1 used), q [k, V] on p's device."""
    k = len(draft)
    if k == 0:
        return [bonus]
    idx = torch.arange(k, device=p.device)
    d = torch.tensor(draft, dtype=torch.int64, device=p.device)
    pd, qd = p[idx, d], q[idx, d].to(p.dtype)
    u = torch.rand(k, generator=generator, device=p.device, dtype=p.dtype)
    ok = (u * qd < pd).tolist()  # u < p/q without dividing (q(d) > 0: d was drawn from q)
    for j in range(k):
        if not ok[j]:
            res = (p[j] - q[j].to(p.dtype)).clamp_min(0.0)
            if float(res.sum()) <= 0.0:  # p == q up to rounding
                res = p[j]
            e = int(torch.multinomial(res / res.sum(), 1, generator=generator)[0])
            return draft[:j] + [e]
    return draft + [bonus]
