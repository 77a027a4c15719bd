"""controller/store/read_memo.py's bounds: an answer is served only under the mark it was read after,
for at most its seconds, and a full memo forgets everything."""

from controller.store.read_memo import ReadMemo


def test_an_answer_is_served_under_its_mark_only_and_not_past_its_seconds():
    now = [100.0]
    memo = ReadMemo(max_entries=10, seconds=5, clock=lambda: now[0])
    memo.put("k", b"mark-1", "answer")
    assert memo.get("k", b"mark-1") == "answer"
    assert memo.get("k", b"mark-2") is None  # a write was committed since
    assert memo.get("other", b"mark-1") is None
    now[0] += 4.9
    assert memo.get("k", b"mark-1") == "answer"
    now[0] += 0.1
    assert memo.get("k", b"mark-1") is None  # a write by another program would not change the mark


def test_a_full_memo_forgets_everything_before_keeping_more():
    memo = ReadMemo(max_entries=3, seconds=5)
    for i in range(3):
        memo.put(i, b"m", i)
    assert [memo.get(i, b"m") for i in range(3)] == [0, 1, 2]
    memo.put(3, b"m", 3)
    assert [memo.get(i, b"m") for i in range(4)] == [None, None, None, 3]
