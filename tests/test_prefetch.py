"""The schedule-driven prefetcher: exact bytes, a bounded cache, reads never blocked."""

from __future__ import annotations

import threading
import time

import pytest

from robo_resume.remote.prefetch import Prefetcher, Span


class Files:
    """A fetch function over in-memory files, counting requests and bytes (with a delay)."""

    def __init__(self, sizes: dict[str, int], delay: float = 0.0, fail: set | None = None):
        self.data = {p: bytes((i * 7 + len(p)) % 251 for i in range(n)) for p, n in sizes.items()}
        self.delay, self.fail = delay, set(fail or ())
        self.requests: list[Span] = []
        self.lock = threading.Lock()

    def __call__(self, span: Span) -> bytes:
        time.sleep(self.delay)
        with self.lock:
            self.requests.append(span)
            if span in self.fail:
                self.fail.discard(span)  # fails once
                raise ConnectionResetError(f"reset while fetching {span}")
        return self.data[span.path][span.start : span.end]


def wait_until(cond, timeout: float = 10.0) -> None:
    """Poll ``cond`` (the prefetch runs on threads): fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def chunks(n: int, size: int, path: str = "videos/a.mp4") -> list[Span]:
    return [Span(path, i * size, (i + 1) * size) for i in range(n)]


def test_reads_return_the_exact_bytes_and_are_served_from_the_prefetch():
    files = Files({"videos/a.mp4": 40_000})
    spans = chunks(40, 1000)
    with Prefetcher(files, budget_bytes=8000, threads=2) as p:
        p.plan(spans)
        for s in spans:
            wait_until(lambda s=s: s in files.requests)  # the prefetch runs ahead of the reader
            assert p.read(s) == files.data[s.path][s.start : s.end]
        stats = p.stats
    assert stats.read_bytes == 40_000
    assert stats.fetched_bytes == 40_000  # every byte fetched once: ratio 1.0
    assert stats.fetched_over_read() == 1.0
    assert (stats.hits, stats.misses) == (40, 0)
    assert sorted(files.requests, key=lambda s: s.start) == spans
    assert stats.peak_bytes <= 8000


def test_the_budget_bounds_the_bytes_held():
    files = Files({"videos/a.mp4": 100_000})
    spans = chunks(100, 1000)
    with Prefetcher(files, budget_bytes=5000, threads=2) as p:
        p.plan(spans)
        wait_until(lambda: len(files.requests) == 5)  # no reads: the prefetch fills the budget
        time.sleep(0.2)  # ... and waits
        assert p.held_bytes == 5000
        assert len(files.requests) == 5
        for s in spans:
            p.read(s)
        assert p.stats.peak_bytes <= 5000
        assert p.stats.fetched_bytes == 100_000


def test_a_span_larger_than_the_budget_is_read_directly():
    files = Files({"videos/a.mp4": 10_000})
    spans = [Span("videos/a.mp4", 0, 6000), Span("videos/a.mp4", 6000, 8000)]
    with Prefetcher(files, budget_bytes=4000) as p:
        p.plan(spans)
        wait_until(lambda: spans[1] in files.requests)  # the big one is passed over
        assert p.held_bytes == 2000 and spans[0] not in files.requests
        assert p.read(spans[0]) == files.data["videos/a.mp4"][:6000]
        assert p.read(spans[1]) == files.data["videos/a.mp4"][6000:8000]
        assert (p.stats.misses, p.stats.hits) == (1, 1)
        assert p.stats.fetched_bytes == 8000


def test_no_budget_means_every_read_fetches():
    files = Files({"videos/a.mp4": 5000})
    spans = chunks(5, 1000)
    with Prefetcher(files, budget_bytes=0) as p:
        p.plan(spans)
        assert [p.read(s) for s in spans] == [
            files.data["videos/a.mp4"][s.start : s.end] for s in spans
        ]
        assert (p.stats.misses, p.stats.hits, p.stats.fetched_bytes) == (5, 0, 5000)


def test_a_read_ahead_of_the_prefetch_is_not_fetched_twice():
    files = Files({"videos/a.mp4": 20_000}, delay=0.02)
    spans = chunks(20, 1000)
    with Prefetcher(files, budget_bytes=2000, threads=1) as p:
        p.plan(spans)
        late = spans[15]
        assert p.read(late) == files.data[late.path][late.start : late.end]  # a miss
        for s in spans[:15] + spans[16:]:
            p.read(s)
        assert p.stats.fetched_bytes == 20_000  # span 15 fetched once, by its read
    assert files.requests.count(late) == 1


def test_spans_the_reader_already_holds_are_passed_over_not_fetched():
    """A reader that got ahead of the plan (it read the first spans another way before the
    prefetch started) holds their bytes: the prefetch fetches only the rest."""
    files = Files({"videos/a.mp4": 20_000})
    spans = chunks(20, 1000)
    read_already = set(spans[:8])  # what the reader read before the plan reached it
    with Prefetcher(files, budget_bytes=20_000, threads=2, have=read_already.__contains__) as p:
        p.plan(spans)
        for s in spans[8:]:
            wait_until(lambda s=s: s in files.requests)
            assert p.read(s) == files.data[s.path][s.start : s.end]
        assert (p.stats.hits, p.stats.misses, p.stats.passed) == (12, 0, 8)
        # a read of a passed span is still served, by its own fetch
        assert p.read(spans[3]) == files.data[spans[3].path][3000:4000]
    assert sorted(files.requests, key=lambda s: s.start) == spans[3:4] + spans[8:]


def test_skipped_spans_do_not_hold_the_budget():
    """A reader that skips planned spans: once fetched they are dropped, the prefetch goes on."""
    files = Files({"videos/a.mp4": 30_000})
    spans = chunks(30, 1000)
    with Prefetcher(files, budget_bytes=3000, threads=1) as p:
        p.plan(spans)
        for s in spans[2::3]:  # reads every third span only
            wait_until(lambda s=s: s in files.requests)  # a stalled prefetch would time out here
            assert p.read(s) == files.data[s.path][s.start : s.end]
        assert (p.stats.hits, p.stats.misses) == (10, 0)
        assert p.stats.dropped_bytes >= 18_000  # the two skipped spans before each read
        assert p.stats.peak_bytes <= 3000


def test_a_failed_background_fetch_is_fetched_again_by_its_read():
    spans = chunks(6, 1000)
    files = Files({"videos/a.mp4": 6000}, fail={spans[2]})
    with Prefetcher(files, budget_bytes=6000) as p:
        p.plan(spans)
        wait_until(lambda: len(files.requests) == 6)
        assert [p.read(s) for s in spans] == [files.data[s.path][s.start : s.end] for s in spans]
        assert p.stats.failed == 1
    assert files.requests.count(spans[2]) == 2


def test_a_read_raises_what_its_own_fetch_raises():
    spans = chunks(3, 1000)
    files = Files({"videos/a.mp4": 3000}, fail={spans[1]})
    with Prefetcher(files, budget_bytes=0) as p, pytest.raises(ConnectionResetError, match="reset"):
        p.read(spans[1])


def test_a_new_plan_replaces_the_old_one_and_close_stops_the_threads():
    files = Files({"a": 50_000, "b": 50_000})
    p = Prefetcher(files, budget_bytes=4000, threads=2)
    p.plan(chunks(50, 1000, "a"))
    wait_until(lambda: len(files.requests) == 4)  # the budget is full of a's spans
    p.plan(chunks(50, 1000, "b"))  # e.g. the next epoch, or a resume: a's spans are dropped
    b0 = Span("b", 0, 1000)
    wait_until(lambda: b0 in files.requests)
    assert p.read(b0) == files.data["b"][:1000]
    assert p.stats.hits == 1
    p.close()
    assert not any(t.name.startswith("robo_resume-") for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        p.read(b0)


def test_a_failing_plan_stops_the_prefetch_not_the_reads():
    files = Files({"a": 3000})

    def plan():
        yield Span("a", 0, 1000)
        raise ValueError("the schedule broke")

    with Prefetcher(files, budget_bytes=3000) as p:
        p.plan(plan())
        wait_until(lambda: p.plan_error is not None)
        assert isinstance(p.plan_error, ValueError)
        assert p.read(Span("a", 1000, 2000)) == files.data["a"][1000:2000]


def test_max_ahead_bounds_the_spans_held_and_find_names_them():
    files = Files({"videos/a.mp4": 100_000})
    spans = chunks(100, 1000)
    with Prefetcher(files, budget_bytes=1 << 20, threads=2, max_ahead=4) as p:
        p.plan(spans)
        wait_until(lambda: len(files.requests) == 4)
        time.sleep(0.2)
        assert len(files.requests) == 4  # the budget has room; the span count does not
        assert p.find("videos/a.mp4", 2500) == spans[2]
        assert p.find("videos/a.mp4", 4000) is None  # not fetched yet
        assert p.find("videos/b.mp4", 0) is None
        assert p.read(spans[0]) == files.data["videos/a.mp4"][:1000]
        wait_until(lambda: len(files.requests) == 5)  # a read frees a place


def test_a_read_jumping_ahead_drops_nothing_but_going_on_past_spans_drops_them():
    """With ``lag``, one read far ahead (a decoder opening a file) keeps the spans before it;
    ``lag`` reads past them drop them (the reader skipped them)."""
    files = Files({"videos/a.mp4": 20_000})
    spans = chunks(20, 1000)
    with Prefetcher(files, budget_bytes=1 << 20, threads=2, lag=3) as p:
        p.plan(spans)
        wait_until(lambda: len(files.requests) == 20)
        time.sleep(0.05)
        p.read(spans[10])  # a jump ahead
        assert p.find("videos/a.mp4", 0) == spans[0]
        assert p.stats.dropped_bytes == 0
        for s in spans[11:13]:  # three reads past spans 0..9: they are dropped
            p.read(s)
        assert p.find("videos/a.mp4", 0) is None
        assert p.stats.dropped_bytes == 10 * 1000
        assert p.find("videos/a.mp4", 13_500) == spans[13]  # after the reads: kept


def test_close_without_waiting_returns_while_a_fetch_hangs():
    gate = threading.Event()
    files = Files({"videos/a.mp4": 10_000})

    def fetch(span: Span) -> bytes:
        gate.wait()  # hangs until the test lets it go, after close() returned
        return files(span)

    p = Prefetcher(fetch, budget_bytes=1 << 20, threads=1)
    p.plan(chunks(10, 1000))
    wait_until(lambda: p.held_bytes > 0)
    p.close(wait=False)  # a close that waited for the fetch would never return
    assert p.held_bytes == 0
    gate.set()
    with pytest.raises(RuntimeError, match="closed"):
        p.read(Span("videos/a.mp4", 0, 1000))


def test_span_index_finds_the_span_holding_an_offset():
    from robo_resume.remote.prefetch import SpanIndex

    index = SpanIndex()
    spans = [Span("a", s, s + 10) for s in range(0, 1000, 20)]  # holes between them
    for span in reversed(spans):  # any order
        index.add(span)
    index.add(Span("b", 5, 15))
    assert index.find("a", 25) == Span("a", 20, 30)
    assert index.find("a", 29) == Span("a", 20, 30)
    assert index.find("a", 30) is None  # a hole
    assert index.find("a", 985) == Span("a", 980, 990)
    assert index.find("b", 25) is None and index.find("c", 5) is None
    wide = Span("a", 21, 500)  # overlapping: the latest starting span holding it is found
    index.add(wide)
    assert index.find("a", 25) == wide and index.find("a", 32) == wide
    index.remove(wide)
    assert index.find("a", 32) is None and index.find("a", 25) == Span("a", 20, 30)
    for span in spans:
        index.remove(span)
    assert index.find("a", 25) is None
    index.remove(Span("a", 0, 10))  # not indexed: nothing happens
    index.clear()
    assert index.find("b", 5) is None
