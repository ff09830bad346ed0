"""Jump-forward decoding with the default model (SmolLM2-135M-Instruct): every span a
grammar forces (a JSON schema's property names, a regex's or EBNF's literals) arrives in
one step, tokenized as the tokenizer encodes it; outputs with jump-forward on and off both
validate; streamed text equals non-streamed; seeded samples (n=2) are the same in the
serial and the overlap loop; the pool invariant holds after every run."""

from __future__ import annotations

import functools
import json
import re

import pytest

from radixlm import SamplingParams
from radixlm.constrained.request_mapping import constraint_from_request
from radixlm.engine import Engine
from tests.conftest import requires_default_model
from tests.engine_checks import assert_all_slots_back

pytestmark = [requires_default_model, pytest.mark.slow]
jsonschema = pytest.importorskip("jsonschema")

MAX_NEW = 48
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},  # unbounded: I-JSON ends it within 16 digits
        "city": {"type": "string", "maxLength": 12}}, "required": ["name", "age", "city"]},
    "flags": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]},
                 "maxItems": 2}}, "required": ["id", "ok", "tags"]},
}
REGEX = r"(red|green|blue)-[0-9]{2}"
EBNF = 'root ::= "Answer: " ("yes" | "no") "."'


@pytest.fixture(scope="module")
def make_engine():
    import radixlm.executor.model_runner as mr

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mr, "load_model", functools.cache(mr.load_model))
        yield lambda **kw: Engine(dtype="float32", device="cpu", **{"max_total_tokens": 2048, **kw})


def _cases(engine: Engine):
    """(prompt ids, constraint, check(text), forced literals) per constraint kind."""
    def prompt(text: str) -> list[int]:
        chat = [{"role": "user", "content": text}]
        t = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return list(engine.tokenizer.encode(t, add_special_tokens=False))

    cases = [(prompt(f"Reply with a JSON object ({name})."),
              constraint_from_request({"json_schema": schema}),
              lambda t, s=schema: jsonschema.validate(json.loads(t), s),
              [f'"{p}":' for p in schema["properties"]])
             for name, schema in SCHEMAS.items()]
    cases.append((prompt("A color and a number:"), constraint_from_request({"regex": REGEX}),
                  lambda t: re.fullmatch(REGEX, t) or pytest.fail(repr(t)), ["-"]))
    cases.append((prompt("Is the sky blue?"), constraint_from_request({"ebnf": EBNF}),
                  lambda t: re.fullmatch(r"Answer: (yes|no)\.", t) or pytest.fail(repr(t)),
                  ["Answer:"]))
    return cases


def _params(c, **kw) -> SamplingParams:
    kw.setdefault("temperature", 0.0)
    return SamplingParams(max_new_tokens=MAX_NEW, constraint=c, **kw)


def _stream(engine: Engine, cases, **kw) -> list[list[tuple[str, list[int]]]]:
    """Every step's (text delta, token ids delta) per request, all requests in one batch."""
    rids = [engine.submit(p, _params(c, **kw), stream=True) for p, c, _, _ in cases]
    deltas: dict[str, list] = {r: [] for r in rids}
    while not all(engine.result(r)["finished"] for r in rids):
        for o in engine.step():
            if o.token_ids_delta:
                deltas[o.rid].append((o.text_delta, list(o.token_ids_delta)))
    engine.settle()
    for r in rids:
        assert engine.pop_result(r)["meta_info"]["finish_reason"] == "stop"
    return [deltas[r] for r in rids]


def test_forced_spans_arrive_in_one_step_canonically(make_engine, monkeypatch) -> None:
    from radixlm.constrained.jump_forward import RETOKENIZE_WINDOW, JumpForward

    engine = make_engine(disable_overlap_schedule=True)
    tok = engine.tokenizer
    # After every jump, the output from some boundary within the window on is exactly the
    # tokenizer's own encoding of its text (the re-tokenized tail).
    jumps: list[tuple[list[int], list[int]]] = []
    real = JumpForward.try_jump

    def spy(self, req):
        before = list(req.output_ids)
        made = real(self, req)
        if made:
            jumps.append((before, list(req.output_ids)))
        return made

    monkeypatch.setattr(JumpForward, "try_jump", spy)
    cases = _cases(engine)
    streamed = _stream(engine, cases)
    jf = engine.scheduler.jump_forward
    assert jf.stats.jumps >= len(cases) and jf.stats.jumped_tokens > 0
    assert len(jumps) == jf.stats.jumps
    for before, after in jumps:
        assert len(after) > len(before)
        canonical = [s for s in range(max(0, len(before) - RETOKENIZE_WINDOW), len(before) + 1)
                     if after[:s] == before[:s] and after[s:] == tok.encode(
                         tok.decode(after[s:]), add_special_tokens=False)]
        assert canonical, (tok.decode(before), tok.decode(after), after)
    for (_, _, check, forced), steps in zip(cases, streamed):
        text = "".join(d for d, _ in steps)
        check(text)
        # Every forced literal lies inside one step's delta.
        bounds, pos = [], 0
        for d, _ in steps:
            bounds.append((pos, pos + len(d)))
            pos += len(d)
        for lit in forced:
            i = text.index(lit)
            assert any(a <= i and i + len(lit) <= b for a, b in bounds), (lit, steps)
        # Decode steps: fewer than tokens (the jumped ones cost none).
        assert len(steps) < sum(len(ids) for _, ids in steps)
    assert_all_slots_back(engine)
    # The same requests without streaming: the same text.
    outs = engine.generate([p for p, *_ in cases], [_params(c) for _, c, _, _ in cases])
    assert [o["text"] for o in outs] == ["".join(d for d, _ in s) for s in streamed]
    assert_all_slots_back(engine)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_on_and_off_both_valid(make_engine, overlap) -> None:
    cases = _cases(make_engine())
    for off in (False, True):
        engine = make_engine(disable_overlap_schedule=not overlap, disable_jump_forward=off)
        outs = engine.generate([p for p, *_ in cases], [_params(c) for _, c, _, _ in cases])
        for (_, _, check, _), o in zip(cases, outs):
            assert o["meta_info"]["finish_reason"] == "stop", o
            check(o["text"])
        assert_all_slots_back(engine)
        jf = engine.scheduler.jump_forward
        assert jf is None if off else jf.stats.jumps >= len(cases)
        engine.scheduler.shutdown()


def test_seeded_n2_same_in_both_loops(make_engine) -> None:
    """n=2 (seeds s, s+1) at temperature 1: valid, and the overlap loop -- where a jumping
    request's already launched sample is dropped and its generator restored -- gives the
    serial loop's outputs."""
    cases = _cases(make_engine())[:2]
    texts = {}
    for overlap in (False, True):
        engine = make_engine(disable_overlap_schedule=not overlap)
        params = [_params(c, temperature=1.0, seed=s) for _, c, _, _ in cases for s in (5, 6)]
        prompts = [p for p, *_ in cases for _ in (5, 6)]
        outs = engine.generate(prompts, params)
        for i, o in enumerate(outs):
            cases[i // 2][2](o["text"])
        texts[overlap] = [o["text"] for o in outs]
        assert engine.scheduler.jump_forward.stats.jumps > 0
        assert_all_slots_back(engine)
        engine.scheduler.shutdown()
    assert texts[True] == texts[False]


def test_kv_after_jumps_equals_a_fresh_prefill(make_engine) -> None:
    """The K/V a jumping request leaves in the radix cache (rolled back, the new tail
    extended) is what a fresh prefill of the same ids computes: no stale position."""
    import torch

    engine = make_engine(disable_overlap_schedule=True)
    cases = _cases(engine)
    outs = engine.generate([p for p, *_ in cases], [_params(c) for _, c, _, _ in cases])
    assert engine.scheduler.jump_forward.stats.jumps >= len(cases)
    assert_all_slots_back(engine)
    sched = engine.scheduler
    pool = sched.runner.token_to_kv_pool

    def k_last(ids: list[int]) -> torch.Tensor:  # the last layer's K of every position
        slots = sched.tree_cache.match_prefix(ids).device_indices.to(torch.int64)
        return pool.k_buffers[-1][slots].clone()

    seqs = [p + o["output_ids"][:-1] for (p, *_), o in zip(cases, outs)]  # all with K/V
    for ids in seqs:
        assert sched.tree_cache.match_prefix(ids).prefix_len == len(ids)
    after_jumps = [k_last(ids) for ids in seqs]
    assert sched.flush_cache().success
    fresh_outs = engine.generate(seqs, [SamplingParams(max_new_tokens=1, temperature=0.0)]
                                 * len(seqs))
    assert all(o["meta_info"]["completion_tokens"] == 1 for o in fresh_outs)
    for ids, k in zip(seqs, after_jumps):
        fresh = k_last(ids)
        assert fresh.shape == k.shape
        torch.testing.assert_close(k, fresh, atol=2e-3, rtol=2e-3)
    assert_all_slots_back(engine)


def test_jumped_tails_ride_in_the_decode_step(make_engine, monkeypatch) -> None:
    """A jumped request's new tail is an extend row of the next decode step (a MIXED batch
    with the running requests), never an extend step of jumped tails alone while others
    run (with a new prompt admitted in the same step they join its extend)."""
    from radixlm.constrained.jump_forward import awaiting_extend
    from radixlm.forward_batch import ForwardMode
    from radixlm.scheduler.scheduler import Scheduler

    engine = make_engine(disable_overlap_schedule=True)
    seen: list[tuple[ForwardMode, bool, int]] = []  # (mode, only jumped tails extend, running)
    real = Scheduler._next_batch

    def spy(self):
        jumped = {id(r) for r in self.waiting if awaiting_extend(r)}
        batch = real(self)
        if batch is not None:
            ext = batch.extend_reqs if batch.forward_mode.is_extend() else []
            only = bool(ext) and all(id(r) in jumped for r in ext)
            seen.append((batch.forward_mode, only, len(self.running)))
        return batch

    monkeypatch.setattr(Scheduler, "_next_batch", spy)
    cases = _cases(engine)
    outs = engine.generate([p for p, *_ in cases], [_params(c) for _, c, _, _ in cases])
    for (_, _, check, _), o in zip(cases, outs):
        check(o["text"])
    assert engine.scheduler.jump_forward.stats.jumps >= len(cases)
    assert any(m is ForwardMode.MIXED and j for m, j, _ in seen), seen
    assert not [s for s in seen if s[0] is ForwardMode.EXTEND and s[1] and s[2]], seen
    assert_all_slots_back(engine)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_jumped_tokens_get_the_models_logprobs(make_engine, monkeypatch, overlap) -> None:
    """Requests asking for logprobs jump too; a jumped token's logprob (and top-2) is the
    model's: the prompt logprob of the same position in a fresh prefill of prompt + output."""
    from radixlm.constrained.jump_forward import JumpForward

    engine = make_engine(disable_overlap_schedule=not overlap)
    jumped: dict[str, list[tuple[int, int]]] = {}
    real = JumpForward.try_jump

    def spy(self, req):
        n = len(req.output_ids)
        made = real(self, req)
        if made:
            jumped.setdefault(req.rid, []).append((n, len(req.output_ids)))
        return made

    monkeypatch.setattr(JumpForward, "try_jump", spy)
    cases = _cases(engine)[:3]
    rids = [engine.submit(p, _params(c, logprobs=True, top_logprobs=2), stream=True)
            for p, c, _, _ in cases]
    engine.run_until_done(rids)
    outs = [engine.pop_result(r) for r in rids]
    assert_all_slots_back(engine)
    assert sum(len(v) for v in jumped.values()) >= len(cases)
    for rid, (prompt, _, check, _), o in zip(rids, cases, outs):
        check(o["text"])
        ids = o["output_ids"]
        assert [lp.token_id for lp in o["logprobs"]] == ids  # one per token, in order
        ref = engine.generate(prompt + ids, SamplingParams(max_new_tokens=0, prompt_logprobs=2))
        plp = ref["prompt_logprobs"]
        first = len(prompt) - 1  # prompt_logprobs entry of output token 0
        n_jumped = 0
        for a, b in jumped.get(rid, []):
            for i in range(a, b):
                lp, e = o["logprobs"][i], first + i
                assert plp.token_ids[e] == ids[i]
                assert lp.logprob == pytest.approx(plp.logprobs[e], abs=2e-3), (i, lp)
                assert [t for t, _ in lp.top] == plp.top_ids[e]
                n_jumped += 1
        assert n_jumped > 0
    assert_all_slots_back(engine)


LINES_SCHEMA = {"type": "object", "properties": {"lines": {
    "type": "array", "minItems": 3, "maxItems": 3,
    "items": {"type": "string", "minLength": 60, "maxLength": 80}}}, "required": ["lines"]}
SEA_REGEX = r"[a-z ,]{200,260}\. Done: (yes|no)\."


@pytest.mark.timeout(1800)
def test_retraction_while_jumping(make_engine, monkeypatch) -> None:
    """A pool far too small for the batch: 8 long constrained outputs (45-130 tokens) in
    256 KV slots, admitted boldly (new-token ratio 0.1). The decode step runs out of slots
    and retracts requests, some of them waiting with a jumped tail; every output still
    validates and no slot leaks."""
    from radixlm.constrained.jump_forward import JumpForward, awaiting_extend

    engine = make_engine(max_total_tokens=256, chunked_prefill_size=64,
                         init_new_token_ratio=0.1, min_new_token_ratio=0.05,
                         disable_overlap_schedule=False)
    sched = engine.scheduler
    jumped: set[str] = set()
    real_jump = JumpForward.try_jump

    def jump_spy(self, req):
        made = real_jump(self, req)
        if made:
            jumped.add(req.rid)
        return made

    retracted: list[tuple[bool, bool]] = []  # (waiting with a jumped tail, had jumped)
    real_retract = sched.kv.retract

    def retract_spy(req):
        retracted.append((awaiting_extend(req), req.rid in jumped))
        return real_retract(req)

    monkeypatch.setattr(JumpForward, "try_jump", jump_spy)
    monkeypatch.setattr(sched.kv, "retract", retract_spy)

    def prompt(text: str) -> list[int]:
        chat = [{"role": "user", "content": text}]
        t = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                 tokenize=False)
        return list(engine.tokenizer.encode(t, add_special_tokens=False))

    schema = constraint_from_request({"json_schema": LINES_SCHEMA})
    regex = constraint_from_request({"regex": SEA_REGEX})
    prompts = ([prompt("Write three lines of a poem as JSON.")] * 4
               + [prompt("Describe the sea.")] * 4)
    params = [SamplingParams(max_new_tokens=200, temperature=0.8, seed=s, constraint=c)
              for s, c in enumerate([schema] * 4 + [regex] * 4)]
    outs = engine.generate(prompts, params)
    for i, o in enumerate(outs):
        assert o["meta_info"]["finish_reason"] == "stop", o
        if i < 4:
            jsonschema.validate(json.loads(o["text"]), LINES_SCHEMA)
        else:
            assert re.fullmatch(SEA_REGEX, o["text"]), o["text"]
    assert sched.num_retractions > 0, retracted  # the decode step really ran out
    assert sched.jump_forward.stats.jumps >= len(outs)
    assert any(w for w, _ in retracted) and any(j for _, j in retracted), retracted
    assert_all_slots_back(engine)
    engine.scheduler.shutdown()


@pytest.mark.timeout(1800)
def test_deterministic_inference_with_jumps(make_engine) -> None:
    """--enable-deterministic-inference: the same outputs alone and in one batch."""
    cases = _cases(make_engine())[1:3]
    engine = make_engine(enable_deterministic_inference=True)
    prompts, params = [p for p, *_ in cases], [_params(c) for _, c, _, _ in cases]
    together = [o["output_ids"] for o in engine.generate(prompts, params)]
    alone = [engine.generate(p, sp)["output_ids"] for p, sp in zip(prompts, params)]
    assert together == alone
    assert engine.scheduler.jump_forward.stats.jumps >= len(cases)
    assert_all_slots_back(engine)
