from radixlm.messages import ReqTokenOut
from radixlm.tokenizer.detokenizer import Detokenizer


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
