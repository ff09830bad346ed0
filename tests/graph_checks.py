"""The check both decode-graph tests make of one replay (CUDA/eager-replay graphs in
test_decode_graphs.py, compiled graphs in test_compiled_decode.py)."""

from __future__ import annotations

import torch


def replay_matches_eager(runner, graphs, fb) -> torch.Tensor:
    """Run `fb` eagerly, then through `graphs`: the logits agree (1e-5, same argmax); the
    replay rewrote this step's own slots with the same K/V (up to the GEMM's rounding at
    another batch size) and touched no other real slot (padding wrote only slot 0).
    Returns the eager logits."""
    pool = runner.token_to_kv_pool
    with torch.inference_mode():
        eager = runner.run_model(fb).clone()  # writes this step's K/V into its slots
    before = [b.clone() for b in pool.k_buffers + pool.v_buffers]
    replayed = graphs.replay(fb).clone()  # writes the same K/V again, plus slot 0
    after = [b.clone() for b in pool.k_buffers + pool.v_buffers]
    assert replayed.shape == eager.shape
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    assert replayed.argmax(-1).tolist() == eager.argmax(-1).tolist()
    mine = fb.out_cache_loc
    others = torch.ones(before[0].shape[0], dtype=torch.bool, device=mine.device)
    others[0] = False
    others[mine] = False
    for b, a in zip(before, after):
        assert torch.equal(b[others], a[others])
        torch.testing.assert_close(a[mine], b[mine], rtol=1e-5, atol=1e-5)
    return eager
