from radixlm.messages import ReqTokenOut
from radixlm.tokenizer.detokenizer import Detokenizer, make_decode


class ByteTokenizer:
    """Each id is one byte: exercises multi-byte UTF-8 split across tokens."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return bytes(ids).decode("utf-8", errors="replace")


def stream(detok, rid, chunks, finish=None, matched=None, hold=0):
    texts = []
    for i, c in enumerate(chunks):
        last = i == len(chunks) - 1
        out = ReqTokenOut(rid=rid, new_token_ids=c, finish_reason=finish if last else None,
                          matched_stop=matched if last else None, stop_hold_chars=hold)
        texts.append(detok.handle(out).text_delta)
    return texts


def test_never_splits_a_utf8_character():
    d = Detokenizer(ByteTokenizer())
    data = list("héllo €".encode())
    deltas = stream(d, "a", [[b] for b in data], finish="length")
    assert "".join(deltas) == "héllo €"
    assert all("\ufffd" not in t for t in deltas)


def test_stop_string_is_cut_and_never_half_sent():
    d = Detokenizer(ByteTokenizer())
    data = list(b"abc STOP def")[:8]  # generation ended when "STOP" completed
    deltas = stream(d, "b", [[b] for b in data], finish="stop", matched="STOP", hold=3)
    assert "".join(deltas) == "abc "
    assert all("S" not in t for t in deltas)


def test_stop_token_is_not_in_text():
    d = Detokenizer(ByteTokenizer())
    deltas = stream(d, "c", [list(b"hi"), [ord("!")]], finish="stop", matched=ord("!"))
    assert "".join(deltas) == "hi"


def _chunks(data: list[int], size: int) -> list[list[int]]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_several_tokens_per_message_give_the_same_text():
    """--stream-interval: a message carries several tokens; a chunk may end inside a
    UTF-8 character or a stop string's hold-back window; the text stays the same."""
    data = list("añb€ STOP ü".encode())[:12]  # ends when "STOP" completed
    for size in (1, 2, 3, 4, 7, len(data)):
        d = Detokenizer(ByteTokenizer())
        deltas = stream(d, "s", _chunks(data, size), finish="stop", matched="STOP", hold=3)
        assert "".join(deltas) == "añb€ ", size
        assert all("\ufffd" not in t and "S" not in t for t in deltas), (size, deltas)
        d = Detokenizer(ByteTokenizer())
        deltas = stream(d, "u", _chunks(list("añb€ ü".encode()), size), finish="length")
        assert "".join(deltas) == "añb€ ü"
        assert not d.states  # a finished request's state is dropped


def test_fast_decode_equals_the_tokenizers_decode():
    """The Rust backend's decode, called directly, is the tokenizer's `decode` (special
    tokens skipped or not, partial UTF-8 characters included)."""
    import random

    pytest = __import__("pytest")
    try:
        from radixlm.models.loader import resolve_model_path
        from radixlm.tokenizer.loader import load_tokenizer

        tok = load_tokenizer(resolve_model_path(None))
    except Exception as e:  # no default model installed
        pytest.skip(f"default model's tokenizer unavailable: {e}")
    assert getattr(tok, "is_fast", False)
    fast = make_decode(tok)
    rng = random.Random(0)
    specials = list(tok.all_special_ids)
    for _ in range(300):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tok))
               for _ in range(rng.randrange(1, 6))]
        for skip in (True, False):
            want = tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert fast(ids, skip) == want, (ids, skip)


def test_slow_tokenizer_falls_back_to_its_decode():
    assert make_decode(ByteTokenizer())(list("é".encode()), True) == "é"
