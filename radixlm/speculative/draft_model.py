"""STANDALONE drafter: a small draft model (same tokenizer) on its own small KV pool.

The draft model is loaded and run by the target's model code (`models.load_model`, the
attention backends, ForwardBatch) over pools of its own: a ReqToTokenPool row per drafting
request and a page-1 KVSlotAllocator/TokenToKVPool sized for the running requests.
Invariants, per request with a row (`_DraftKV`): positions [0, kv_len) of its row hold K/V
for the request's tokens [0, base) followed by `fed` (drafts fed back, not yet verified);
every other slot of the pool is free. A proposal first rolls the row back to the longest
prefix that still equals the request's tokens (what the target accepted: rejected drafts'
slots are freed at once), feeds the tokens since then as one EXTEND, then draws k tokens
with k-1 DECODE steps. Greedy requests draft the argmax (a point mass, Draft.probs None);
sampling requests draw with their own generator from the draft's law under their own
temperature and cuts, returned per position for rejection sampling. `forget(rid)` frees a
request's row and slots (finish, abort, retraction: called when it leaves the running set).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.attention import create_attention_backend
from radixlm.executor.sampler import Sampler, SamplingBatchInfo
from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.mem import KVSlotAllocator, ReqToTokenPool, TokenToKVPool
from radixlm.models import load_model, resolve_model_path
from radixlm.models.loader import load_model_config
from radixlm.speculative.drafter import Draft

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req

logger = logging.getLogger(__name__)


class DraftVocabError(ValueError):
    """The draft model's vocabulary is not the target's."""


def check_vocab(draft_path: str, draft_vocab_size: int, target_vocab_size: int,
                target_tokenizer) -> None:
    """Refuse a draft model whose logits or token ids do not mean the target's."""
    if draft_vocab_size != target_vocab_size:
        raise DraftVocabError(
            f"--speculative-draft-model-path {draft_path}: its vocabulary has "
            f"{draft_vocab_size} tokens, the target's {target_vocab_size}; the draft model "
            "must use the target's tokenizer")
    if target_tokenizer is None:
        return
    from radixlm.tokenizer.loader import load_tokenizer
    try:
        draft_tok = load_tokenizer(draft_path)
    except Exception as e:  # noqa: BLE001 - a checkpoint without tokenizer files
        logger.warning("draft model %s: no tokenizer to compare (%s); vocab size matches",
                       draft_path, e)
        return
    want, got = target_tokenizer.get_vocab(), draft_tok.get_vocab()
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))
        raise DraftVocabError(
            f"--speculative-draft-model-path {draft_path}: its tokenizer differs from the "
            f"target's ({len(diff)} (token, id) pairs differ, e.g. {diff[:3]}); the draft "
            "model must use the target's tokenizer")


@dataclass
class _DraftKV:
    row: int
    kv_len: int = 0  # positions with K/V in the draft pool
    base: int = 0  # the first `base` of them are the request's tokens
    fed: list[int] = field(default_factory=list)  # positions base .. kv_len - 1


def _token_at(req: "Req", pos: int) -> int:
    n_in = len(req.input_ids)
    return req.input_ids[pos] if pos < n_in else req.output_ids[pos - n_in]


def _tokens_from(req: "Req", start: int) -> list[int]:
    n_in = len(req.input_ids)
    if start < n_in:
        return req.input_ids[start:] + req.output_ids
    return req.output_ids[start - n_in:]


class DraftModelDrafter:
    name = "STANDALONE"
    costly = True  # proposing runs forwards: the controller proposes once, from exact state

    def __init__(self, model: torch.nn.Module, vocab_size: int, *, num_layers: int,
                 kv_heads: int, head_dim: int, max_requests: int, context_len: int,
                 num_slots: int, device: torch.device, kv_dtype: torch.dtype,
                 attention_backend: str = "torch", sliding_window: bool = False) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.device = device
        self.context_len = context_len
        self.req_to_token_pool = ReqToTokenPool(max_requests, context_len, device)
        self.token_to_kv_pool = TokenToKVPool(num_slots, num_layers, kv_heads, head_dim,
                                              kv_dtype, device)
        self.allocator = KVSlotAllocator(num_slots, device, 1)
        self.backend = create_attention_backend(attention_backend, device,
                                                sliding_window=sliding_window)
        self._kv: dict[str, _DraftKV] = {}

    @classmethod
    def load(cls, path: str, runner, tokenizer, k: int) -> "DraftModelDrafter":
        """The draft model at `path` in the target runner's dtype and device, its pools
        sized for the runner's running requests (their KV tokens plus k drafts each)."""
        path = resolve_model_path(path)
        cfg = load_model_config(path)
        check_vocab(path, cfg.vocab_size, runner.vocab_size, tokenizer)
        model, cfg = load_model(path, runner.dtype, runner.device)
        rows = runner.max_running_requests
        ctx = min(runner.context_len, cfg.max_position_embeddings)
        logger.info("draft model %s: %d layers, pool of %d KV tokens, %d rows", path,
                    cfg.num_layers, runner.max_total_tokens + rows * k, rows)
        return cls(model, cfg.vocab_size, num_layers=cfg.num_layers,
                   kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, max_requests=rows,
                   context_len=ctx, num_slots=runner.max_total_tokens + rows * k,
                   device=runner.device, kv_dtype=runner.kv_dtype,
                   attention_backend=runner.args.attention_backend,
                   sliding_window=bool(cfg.sliding_layers and any(cfg.sliding_layers)))

    # --- state ----------------------------------------------------------------------

    @property
    def tracked(self) -> set[str]:
        return set(self._kv)

    def forget(self, rid: str) -> None:
        st = self._kv.pop(rid, None)
        if st is not None:
            self._truncate(st, 0)
            self.req_to_token_pool.free(st.row)

    def _truncate(self, st: _DraftKV, n: int) -> None:
        if st.kv_len > n:
            slots = self.req_to_token_pool.req_to_token[st.row, n:st.kv_len]
            self.allocator.free(slots.to(torch.int64))
        st.kv_len = min(st.kv_len, n)
        st.base, st.fed = st.kv_len, []

    def _sync(self, req: "Req") -> _DraftKV | None:
        """The request's row, rolled back to the longest prefix equal to its tokens (and
        short of its newest token, whose logits the proposal needs)."""
        st = self._kv.get(req.rid)
        if st is None:
            row = self.req_to_token_pool.alloc()
            if row is None:
                return None
            st = self._kv[req.rid] = _DraftKV(row)
        n = req.seq_len
        valid = st.base if st.base <= n else 0
        if valid == st.base:
            for tok in st.fed:
                if valid >= n or _token_at(req, valid) != tok:
                    break
                valid += 1
        self._truncate(st, min(valid, n - 1))
        return st

    def check(self, live: set[str]) -> None:
        """Raise AssertionError unless only `live` requests hold rows and every slot is
        free or in exactly one held row's [0, kv_len)."""
        assert set(self._kv) <= live, set(self._kv) - live
        held = [self.req_to_token_pool.req_to_token[st.row, :st.kv_len].to(torch.int64)
                for st in self._kv.values()]
        used = torch.cat(held) if held else torch.empty(0, dtype=torch.int64)
        assert used.unique().numel() == used.numel(), "a draft KV slot is held twice"
        assert used.numel() + self.allocator.available_size() == self.allocator.size, (
            used.numel(), self.allocator.available_size(), self.allocator.size)
        assert (self.req_to_token_pool.available_size() + len(self._kv)
                == self.req_to_token_pool.size)

    # --- proposing ------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, reqs: list["Req"], max_tokens: list[int]) -> list[Draft]:
        out = [Draft() for _ in reqs]
        act: list[tuple[int, _DraftKV, int, torch.Tensor, list[int]]] = []
        for i, (r, k) in enumerate(zip(reqs, max_tokens)):
            if k <= 0 or r.seq_len + k > self.context_len:
                continue
            st = self._sync(r)
            if st is None:
                continue
            feed = _tokens_from(r, st.kv_len)
            slots = self.allocator.alloc(len(feed) + k - 1)
            if slots is None:
                continue  # the draft pool is full: this request does not draft this step
            self.req_to_token_pool.write(st.row, st.kv_len, slots)
            act.append((i, st, k, slots, feed))
        if not act:
            return out
        areqs = [reqs[i] for i, *_ in act]
        logits = self._forward(ForwardMode.EXTEND, [st.row for _, st, *_ in act],
                               [st.kv_len for _, st, *_ in act], [f for *_, f in act],
                               torch.cat([s[:len(f)] for *_, s, f in act]))
        toks: list[list[int]] = [[] for _ in act]
        qs: list[list[torch.Tensor]] = [[] for _ in act]
        step_rows = list(range(len(act)))
        for j in range(max(k for _, _, k, _, _ in act)):
            info = SamplingBatchInfo.from_reqs([areqs[a] for a in step_rows], self.vocab_size,
                                               self.device)
            q = Sampler.distribution(logits, info)
            for row_i, a in enumerate(step_rows):
                r = areqs[a]
                if info.greedy[row_i]:
                    toks[a].append(int(q[row_i].argmax()))
                else:
                    toks[a].append(int(torch.multinomial(q[row_i], 1, generator=r.generator)[0]))
                    qs[a].append(q[row_i])
            step_rows = [a for a in step_rows if act[a][2] > j + 1]
            if not step_rows:
                break
            n_feed = [len(act[a][4]) for a in step_rows]
            pos = [act[a][1].kv_len + n + j for a, n in zip(step_rows, n_feed)]
            logits = self._forward(ForwardMode.DECODE, [act[a][1].row for a in step_rows], pos,
                                   [[toks[a][-1]] for a in step_rows],
                                   torch.stack([act[a][3][n + j] for a, n in zip(step_rows, n_feed)]))
        for a, (i, st, k, _, feed) in enumerate(act):
            st.kv_len += len(feed) + k - 1
            st.base = reqs[i].seq_len
            st.fed = toks[a][:k - 1]
            out[i] = Draft(toks[a], torch.stack(qs[a]) if qs[a] else None)
        return out

    def _forward(self, mode: ForwardMode, rows: list[int], prefix: list[int],
                 feeds: list[list[int]], locs: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] at each request's last fed token."""
        ext = [len(f) for f in feeds]
        seq = [p + e for p, e in zip(prefix, ext)]
        positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)])
        dev = self.device
        fb = ForwardBatch(
            forward_mode=mode, batch_size=len(rows),
            input_ids=torch.tensor([t for f in feeds for t in f], dtype=torch.int64, device=dev),
            positions=positions.to(dev),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=dev),
            out_cache_loc=locs.to(dev, torch.int64),
            logits_indices=(torch.tensor(ext).cumsum(0) - 1).to(dev),
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix if mode is ForwardMode.EXTEND else None,
            extend_seq_lens_cpu=ext if mode is ForwardMode.EXTEND else None,
            req_pool_indices_cpu=rows if mode is ForwardMode.EXTEND else None,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.backend)
        self.backend.init_forward_metadata(fb)
        return self.model(fb).float()

