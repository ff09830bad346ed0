"""ApproxRadixTree: longest-prefix match, splits, size accounting, LRU eviction."""

from __future__ import annotations

import random

from radixlm.router.approx_tree import ApproxRadixTree, _common_prefix_len


def _brute_match(stored: list[str], text: str) -> int:
    return max((_common_prefix_len(s, text) for s in stored), default=0)


def test_common_prefix_len() -> None:
    assert _common_prefix_len("abcdef", "abcxyz") == 3
    assert _common_prefix_len("abc", "abc") == 3
    assert _common_prefix_len("abc", "abcd") == 3
    assert _common_prefix_len("", "a") == 0
    assert _common_prefix_len("xa", "ya") == 0


def test_match_and_split() -> None:
    t = ApproxRadixTree()
    assert t.match("anything") == 0
    t.insert("hello world")
    assert t.size == len("hello world")
    assert t.match("hello world") == 11
    assert t.match("hello there") == 6  # ends inside the edge
    assert t.match("hello world, longer") == 11
    t.insert("hello there")  # splits "hello world" after "hello "
    assert t.size == len("hello world") + len("there")
    assert t.match("hello there") == 11
    assert t.match("hello world") == 11
    t.insert("hello")  # already a prefix: nothing new stored
    assert t.size == len("hello world") + len("there")


def test_matches_brute_force_on_random_texts() -> None:
    rng = random.Random(0)
    stored: list[str] = []
    t = ApproxRadixTree()
    for _ in range(300):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.5:
            t.insert(text)
            stored.append(text)
        assert t.match(text, touch=False) == _brute_match(stored, text)
    # size = characters of the trie of all stored strings = distinct non-empty prefixes
    assert t.size == len({s[:i] for s in stored for i in range(1, len(s) + 1)})


def test_evict_removes_least_recently_used_first() -> None:
    t = ApproxRadixTree()
    t.insert("shared prefix / old branch")
    t.insert("shared prefix / new branch")
    t.insert("unrelated text")
    t.match("shared prefix / new branch")  # touch: now the newest path
    t.match("unrelated text")
    size = t.size
    removed = t.evict(size - 1)
    assert removed == len("old branch")  # the oldest leaf only
    assert t.match("shared prefix / old branch") == len("shared prefix / ")
    assert t.match("shared prefix / new branch") == len("shared prefix / new branch")
    assert t.match("unrelated text") == len("unrelated text")


def test_evict_cascades_to_parents_and_respects_bound() -> None:
    t = ApproxRadixTree()
    for i in range(50):
        t.insert(f"group {i % 5} " + "x" * i)
    t.evict(40)
    assert t.size <= 40
    t.evict(0)
    assert t.size == 0
    assert t.match("group 1 x") == 0


def test_match_without_touch_does_not_refresh_age() -> None:
    t = ApproxRadixTree()
    t.insert("aaa")
    t.insert("bbb")
    t.match("aaa", touch=False)  # a look only: "aaa" stays the oldest
    t.evict(3)
    assert t.match("aaa") == 0 and t.match("bbb") == 3
