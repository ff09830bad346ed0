"""Sampler: logits of the last position of each request -> next token (+ logprobs).

More: docs/executor.md, "executor/sampler.py".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from radixlm.cpu_kernels.ops import sampling_kernel
from radixlm.messages import TokenLogprob
from radixlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.executor.prompt_logprobs import PromptLogprobTensors

logger = logging.getLogger(__name__)


class SamplingRow(Protocol):
    """What sampling reads of one request (the scheduler's Req provides it): its params,
    its generator, its length, and its penalty state, whose counts the forward thread
    advances after each sample (forward_worker.py). The executor imports no scheduler type."""
    sampling_params: SamplingParams
    generator: torch.Generator | None
    output_counts: torch.Tensor | None  # [V] float32, penalized requests only
    seen_mask: torch.Tensor | None  # [V] bool: prompt and output tokens

    @property
    def seq_len(self) -> int: ...

    @property
    def uses_penalties(self) -> bool: ...


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [B, 1]
    top_ps: torch.Tensor  # [B]
    top_ks: torch.Tensor  # [B] int64, vocab size where unset
    min_ps: torch.Tensor  # [B]
    greedy: list[bool]
    # [S] int64: indices of the rows that draw (not greedy), on the sampling device. Built
    # with the batch, so on CUDA it is uploaded at launch with the other inputs instead of
    # a synchronizing host->device copy on the forward thread.
    sample_rows: torch.Tensor
    drawing: list[int]  # the same indices as a list (generators, warnings)
    # [S] per drawing row, for the CPU sampling kernel (built with the batch, like
    # sample_rows: no per-step indexing): 1 / temperature, top_k, top_p, min_p.
    sample_params: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    generators: list[torch.Generator | None]
    need_top_k_p: bool
    need_min_p: bool
    # Penalties (None when no request in the batch uses one).
    penalized_rows: list[int] | None = None
    output_counts: torch.Tensor | None = None  # [P, V]
    seen_mask: torch.Tensor | None = None  # [P, V] bool
    frequency: torch.Tensor | None = None  # [P, 1]
    presence: torch.Tensor | None = None  # [P, 1]
    repetition: torch.Tensor | None = None  # [P, 1]
    # logit_bias of the whole batch, flattened: (rows [K], token ids [K], biases [K]).
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    want_logprobs: list[bool] | None = None
    top_logprobs: list[int] | None = None  # alternatives each request asked for
    # Deterministic mode: each row's seed (the request's, else the one the scheduler drew
    # for it; None when greedy) and the position of the token being sampled.
    seeds: list[int | None] | None = None
    positions: list[int] | None = None
    # [S] float64, per drawing row: deterministic_uniform(seed, position), the draw of
    # --enable-deterministic-inference (computed with the batch, like sample_rows; None
    # outside that mode).
    uniforms: torch.Tensor | None = None

    @classmethod
    def from_reqs(cls, reqs: list[SamplingRow], vocab_size: int, device: torch.device,
                  positions: list[int] | None = None, penalty_state: bool = True,
                  deterministic: bool = False) -> "SamplingBatchInfo":
        """`positions`: where each request's sampled token goes (the forward batch's
        seq_lens). Default: req.seq_len, right only when every earlier sample of the request
        has been appended (the serial loop; the overlap loop must pass them).
        `penalty_state=False`: leave output_counts / seen_mask to `attach_penalty_state`
        (the forward worker builds the rest at launch, before the previous step's counts
        are in). `deterministic`: also the counter-based draws' uniforms (what
        Sampler(deterministic=True) draws with)."""
        ps = [r.sampling_params for r in reqs]
        greedy = [p.is_greedy for p in ps]
        temps = [1.0 if g else p.temperature for g, p in zip(greedy, ps)]
        top_ks = [vocab_size if p.top_k < 1 else min(p.top_k, vocab_size) for p in ps]
        drawing = [i for i, g in enumerate(greedy) if not g]
        temperatures = torch.tensor(temps, dtype=torch.float32, device=device).unsqueeze(1)
        info = cls(
            temperatures=temperatures,
            top_ps=torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=device),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=torch.tensor([p.min_p for p in ps], dtype=torch.float32, device=device),
            greedy=greedy,
            sample_rows=torch.tensor(drawing, dtype=torch.int64, device=device),
            drawing=drawing,
            sample_params=(
                (1.0 / temperatures[drawing]).flatten(),
                torch.tensor([top_ks[i] for i in drawing], dtype=torch.int64, device=device),
                torch.tensor([ps[i].top_p for i in drawing], dtype=torch.float32,
                             device=device),
                torch.tensor([ps[i].min_p for i in drawing], dtype=torch.float32,
                             device=device)),
            generators=[r.generator for r in reqs],
            need_top_k_p=any(not g and (p.top_p < 1.0 or p.top_k >= 1) for g, p in zip(greedy, ps)),
            need_min_p=any(not g and p.min_p > 0.0 for g, p in zip(greedy, ps)),
            want_logprobs=[p.logprobs for p in ps],
            top_logprobs=[p.top_logprobs if p.logprobs else 0 for p in ps],
            seeds=[None if g else p.seed if p.seed is not None
                   else r.generator.initial_seed() if r.generator is not None else 0
                   for g, p, r in zip(greedy, ps, reqs)],
            positions=list(positions) if positions is not None else [r.seq_len for r in reqs],
        )
        if deterministic:
            info.uniforms = torch.tensor(
                [deterministic_uniform(info.seeds[i], info.positions[i]) for i in drawing],
                dtype=torch.float64, device=device)
        biased = [i for i, p in enumerate(ps) if p.logit_bias]
        if biased:
            b_rows = [i for i in biased for _ in ps[i].logit_bias]
            b_ids = [t for i in biased for t in ps[i].logit_bias]
            b_vals = [v for i in biased for v in ps[i].logit_bias.values()]
            info.logit_bias = (torch.tensor(b_rows, dtype=torch.int64, device=device),
                               torch.tensor(b_ids, dtype=torch.int64, device=device),
                               torch.tensor(b_vals, dtype=torch.float32, device=device))
        rows = [i for i, r in enumerate(reqs) if r.uses_penalties]
        if rows:
            info.penalized_rows = rows
            col = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device).unsqueeze(1)  # noqa: E731
            info.frequency = col([ps[i].frequency_penalty for i in rows])
            info.presence = col([ps[i].presence_penalty for i in rows])
            info.repetition = col([ps[i].repetition_penalty for i in rows])
            if penalty_state:
                info.attach_penalty_state(reqs)
        return info

    def attach_penalty_state(self, reqs: list[SamplingRow]) -> None:
        """The penalized rows' output counts and seen masks, stacked now (device ops on
        the requests' own tensors: on the forward thread, after the previous step's
        counts)."""
        if self.penalized_rows:
            self.output_counts = torch.stack([reqs[i].output_counts for i in self.penalized_rows])
            self.seen_mask = torch.stack([reqs[i].seen_mask for i in self.penalized_rows])


@dataclass
class LogprobTensors:
    """The logprobs a batch asked for, still as tensors: read on the scheduler thread
    (`token_logprobs`), after the one-step-late wait, so the forward thread never waits
    for the device to turn them into Python numbers."""
    chosen: torch.Tensor  # [B] float32: log-probability of each row's sampled token
    top_values: torch.Tensor | None  # [B, k_max] float32, k_max = the batch's largest ask
    top_ids: torch.Tensor | None  # [B, k_max] int64
    want: list[bool]  # rows that asked for logprobs
    top_counts: list[int]  # alternatives each row asked for (<= k_max)

    def map_tensors(self, fn) -> "LogprobTensors":
        opt = lambda t: None if t is None else fn(t)  # noqa: E731
        return LogprobTensors(fn(self.chosen), opt(self.top_values), opt(self.top_ids),
                              self.want, self.top_counts)

    def token_logprobs(self, next_ids: list[int]) -> list[TokenLogprob | None]:
        chosen = self.chosen.tolist()
        top_vals = self.top_values.tolist() if self.top_values is not None else None
        top_ids = self.top_ids.tolist() if self.top_ids is not None else None
        out: list[TokenLogprob | None] = []
        for i, want in enumerate(self.want):
            if not want:
                out.append(None)
                continue
            k = self.top_counts[i]  # this request's count, not the batch max
            top = list(zip(top_ids[i][:k], top_vals[i][:k])) if top_ids is not None else []
            # Tokens masked out by a grammar have logprob -inf: not reported (not JSON).
            top = [(t, v) for t, v in top if v != _NEG_INF]
            out.append(TokenLogprob(next_ids[i], chosen[i], top))
        return out


@dataclass
class SampleOutput:
    # [B] int64: on the sampling device; on CUDA the forward worker hands the scheduler a
    # pinned host copy, complete once ForwardWorker.wait returned (executor/cuda_streams.py).
    next_token_ids: torch.Tensor
    # None when no row asked for logprobs; copied to the host like next_token_ids.
    logprob_tensors: LogprobTensors | None = None
    # Requests of the batch (index in ForwardBatch order -> the OOM diagnosis) whose
    # forward ran out of memory even alone; their rows of next_token_ids are meaningless
    # (forward_worker.py `_forward`; the scheduler fails them: request_oom.py).
    failed: dict[int, str] | None = None
    # EXTEND: the prompt logprobs the batch's plan asked for (executor/prompt_logprobs.py).
    prompt_logprobs: "PromptLogprobTensors | None" = None
    # [B, V] on the device: the rows' logits, when the task asked (ForwardTask.return_logits).
    logits: torch.Tensor | None = None

    def token_logprobs(self) -> list[TokenLogprob | None]:
        """Per row: its TokenLogprob, or None where it did not ask (host reads)."""
        if self.logprob_tensors is None:
            return [None] * len(self.next_token_ids)
        return self.logprob_tensors.token_logprobs(self.next_token_ids.tolist())


class Sampler:
    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SampleOutput:
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(info.want_logprobs) else None
        if info.penalized_rows is not None:
            logits = logits.clone()
            logits[info.penalized_rows] = self._apply_penalties(logits[info.penalized_rows], info)
        if info.logit_bias is not None:
            logits = logits.index_put(info.logit_bias[:2], info.logit_bias[2], accumulate=True)

        # The CPU's sampling kernel (cpu_kernels/sampling.cpp): the same argmax, cuts and
        # inverse-CDF draw without [B, V] probabilities, their cumulative sum or a sort.
        kernel = sampling_kernel() if logits.is_cpu else None
        if kernel is not None:
            logits = logits.contiguous()
        sample_rows = info.drawing
        if len(sample_rows) < len(info.greedy):  # an argmax over V only where a row needs it
            next_ids = (kernel.argmax_rows(logits) if kernel is not None
                        else torch.argmax(logits, dim=-1))
        else:
            next_ids = torch.empty(len(info.greedy), dtype=torch.long, device=logits.device)
        if sample_rows:
            rows = info.sample_rows
            if self.deterministic:
                assert info.uniforms is not None, "from_reqs(deterministic=True) makes them"
                u = info.uniforms
            else:
                # One uniform per row from the request's own generator (its seed), one
                # inverse-CDF scan for all rows (torch.multinomial, row by row, cost ~1 ms
                # a row over a 49k vocabulary on the CPU).
                u = torch.cat([torch.rand(1, dtype=torch.float64, device=logits.device,
                                          generator=info.generators[i]) for i in sample_rows])
            if kernel is not None:
                inv_temps, top_ks, top_ps, min_ps = info.sample_params
                drawn, valid = kernel.sample_rows(logits, rows, inv_temps, u, top_ks, top_ps,
                                                  min_ps)
            else:
                probs = torch.softmax(logits[rows] / info.temperatures[rows], dim=-1)
                # No renormalization after the cut: the draw scales u by each row's own
                # total (deterministic mode needs that too: a [1, V] row sum is split
                # across threads when V >= 32768, so a renormalized row would depend on
                # the batch).
                probs = self._cut(probs, info, rows, normalize=False)
                drawn, valid = draw_rows(probs, u)
            next_ids[rows] = self._valid_or_greedy(drawn, valid, logits, rows, sample_rows)

        return SampleOutput(next_ids, self._logprobs(raw_logprobs, next_ids, info))

    @staticmethod
    def _valid_or_greedy(drawn: torch.Tensor, valid: torch.Tensor, logits: torch.Tensor,
                         rows: torch.Tensor, sample_rows: list[int]) -> torch.Tensor:
        """A row whose probabilities are no distribution (NaN/inf from extreme parameters,
        or all cut away) takes its greedy token instead of taking the scheduler down (found
        by the API fuzzer). On the CPU the check is free and the argmax runs only then; on
        CUDA both run without a host sync."""
        on_cpu = drawn.device.type == "cpu"
        if on_cpu and bool(valid.all()):
            return drawn
        if on_cpu:
            bad = [sample_rows[j] for j in (~valid).nonzero().flatten().tolist()]
            logger.warning("rows %s: no valid sampling distribution; greedy token", bad)
        return torch.where(valid, drawn, logits[rows].argmax(dim=-1))

    @staticmethod
    def distribution(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """[B, V] float32: the law each row draws from (temperature, min-p, top-k/top-p,
        logit_bias; no penalties), a one-hot at the argmax for greedy rows. What
        speculative decoding's rejection sampling compares draft and target by."""
        logits = logits.float()
        if info.logit_bias is not None:
            logits = logits.index_put(info.logit_bias[:2], info.logit_bias[2], accumulate=True)
        probs = torch.softmax(logits / info.temperatures, dim=-1)
        rows = torch.arange(logits.shape[0], device=logits.device)
        probs = Sampler._cut(probs, info, rows)
        greedy = torch.tensor(info.greedy, dtype=torch.bool, device=logits.device)
        if bool(greedy.any()):
            one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
            probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
        return probs

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        # Repetition: positive logits of seen tokens are divided, negative multiplied.
        rep = torch.where(logits > 0, logits / info.repetition, logits * info.repetition)
        logits = torch.where(info.seen_mask, rep, logits)
        logits = logits - info.frequency * info.output_counts
        return logits - info.presence * (info.output_counts > 0).float()

    @staticmethod
    def _cut(probs: torch.Tensor, info: SamplingBatchInfo, rows: torch.Tensor,
             normalize: bool = True) -> torch.Tensor:
        if info.need_min_p:
            min_p = info.min_ps[rows].unsqueeze(1)
            probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        if info.need_top_k_p:
            probs = Sampler._top_k_p(probs, info.top_ks[rows], info.top_ps[rows])
        return probs / probs.sum(dim=-1, keepdim=True) if normalize else probs

    @staticmethod
    def _top_k_p(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
        """Zero every token outside each row's top-k and its top-p nucleus: in descending
        order, keep the smallest prefix whose mass reaches top_p (a token goes when the
        mass strictly before it already reaches top_p; the first always stays).

        On the CPU the order comes from the TOP_P_CANDIDATES largest tokens (a partial
        selection, ~10x cheaper than sorting the vocabulary); rows whose cut falls beyond
        them (a top-k above it, a flat distribution) are sorted in full: exact either way."""
        n, vocab = probs.shape
        k = min(vocab, TOP_P_CANDIDATES) if probs.device.type == "cpu" else vocab
        if k < vocab:
            vals, order = probs.topk(k, dim=-1)
        else:
            vals, order = probs.sort(dim=-1, descending=True)
        cut, before = Sampler._cut_mask(vals, top_ks, top_ps)
        out = torch.zeros_like(probs).scatter_(-1, order, vals.masked_fill(cut, 0.0))
        if k < vocab:
            # A row without a cut keeps everything; one whose (k+1)-th token would still
            # be in (rank below top_k, mass before it below top_p) is sorted in full.
            uncut = (top_ks >= vocab) & (top_ps >= 1.0)
            out[uncut] = probs[uncut]
            whole = ~uncut & (top_ks > k) & (before[:, -1] + vals[:, -1] < top_ps)
            if bool(whole.any()):
                full = whole.nonzero().flatten()
                out[full] = Sampler._top_k_p_sorted(probs[full], top_ks[full], top_ps[full])
        return out

    @staticmethod
    def _top_k_p_sorted(probs: torch.Tensor, top_ks: torch.Tensor,
                        top_ps: torch.Tensor) -> torch.Tensor:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cut, _ = Sampler._cut_mask(sorted_p, top_ks, top_ps)
        return torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(cut, 0.0))

    @staticmethod
    def _cut_mask(sorted_p: torch.Tensor, top_ks: torch.Tensor,
                  top_ps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For probabilities in descending order: which to drop (rank >= top_k, or the mass
        strictly before them already >= top_p), and that mass."""
        before = sorted_p.cumsum(dim=-1) - sorted_p
        rank = torch.arange(sorted_p.shape[-1], device=sorted_p.device)[None, :]
        return (rank >= top_ks.unsqueeze(1)) | (before >= top_ps.unsqueeze(1)), before

    @staticmethod
    def _logprobs(raw: torch.Tensor | None, next_ids: torch.Tensor,
                  info: SamplingBatchInfo) -> LogprobTensors | None:
        """Device tensors only (no host read here: see LogprobTensors)."""
        if raw is None:
            return None
        chosen = raw.gather(1, next_ids.unsqueeze(1)).squeeze(1)
        top_vals = top_ids = None
        k_max = max(info.top_logprobs)
        if k_max:
            top_vals, top_ids = raw.topk(k_max, dim=-1)
        return LogprobTensors(chosen, top_vals, top_ids, list(info.want_logprobs),
                              list(info.top_logprobs))


_NEG_INF = float("-inf")
# Candidates a CPU top-k/top-p cut selects before falling back to a full sort.
TOP_P_CANDIDATES = 1024
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def deterministic_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that is a pure function of (seed, position): the top 53
    bits of a two-round 64-bit hash, so nearby seeds and positions are uncorrelated."""
    return (_splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 11) / float(1 << 53)


def inverse_cdf_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row i: the first token whose cumulative probability (vocabulary order) exceeds
    u[i] * total mass. probs [n, V] (>= 0, rows not all 0), u [n] in [0, 1) -> [n] int64.

    A token with probability 0 is never drawn: its cumulative sum equals its
    predecessor's, so it cannot be the first to exceed the target. The cumulative sum is a
    sequential scan of each row, independent of the other rows."""
    return draw_rows(probs, u)[0]


def draw_rows(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """inverse_cdf_draw's tokens and, per row, whether its probabilities were a
    distribution (finite, positive total mass); an invalid row's token is meaningless."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    # u * total may round up to total: the target stays one ulp below it, so the draw is
    # then the last token of positive probability (the first whose cumulative sum
    # reaches the total), never a trailing zero-probability one.
    target = torch.minimum(u.unsqueeze(1) * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    valid = torch.isfinite(total[:, 0]) & (total[:, 0] > 0)
    return idx, valid
