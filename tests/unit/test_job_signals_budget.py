"""Answers that are legal but heavy, and endpoints that hang, against the agent's other users
(issue 33, item 8): a scrape never waits for a parse; a job over its budget is unknown with
the reason, nobody else; one user's endpoints and CPU do not eat another user's."""

from __future__ import annotations

import http.server
import threading
from typing import Any, Callable, Dict, Iterator, List

import pytest

from slurmiso.agent.job_signals import Budget
from slurmiso.exposition import job_series as sig
from tests.unit.test_endpoint_profiles import cum, vllm
from tests.unit.test_job_signals import (
    HANG_CAP_S,
    Clock,
    Server,
    _hang,
    read,
    record,
    scrape_text,
    state,
)

A, B = 1001, 1002


@pytest.fixture
def server(monkeypatch: Any) -> Iterator[Server]:
    """The test server, with an accept queue for 150 connections at once."""
    monkeypatch.setattr(http.server.ThreadingHTTPServer, "request_queue_size", 1024)
    s = Server()
    yield s
    s.close()


def heavy(series: int) -> str:
    """A vLLM answer under the size cap with ``series`` latency buckets over 16 models (under
    the profiles' model cap: the budget, not the cap, is what this answer meets)."""
    lines = [f'vllm:e2e_request_latency_seconds_bucket{{le="{(i % 20 + 1) / 10:.1f}",'
             f'model_name="m{i % 16}"}} {i}' for i in range(series)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("stage", ["parse", "window"])
def test_a_scrape_never_waits_for_a_parse(server: Server, monkeypatch: Any, stage: str
                                          ) -> None:
    """The parse and the window's update run outside the lock a scrape needs: a scrape during
    either, which ends only when the test says so, is answered with the last figures."""
    from slurmiso.agent import job_signals

    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    st = state(Clock())
    recs = {"41": record("41", f"{server.port}/metrics")}
    st.refresh(recs)
    busy, release = threading.Event(), threading.Event()

    def held(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            busy.set()
            release.wait(HANG_CAP_S)
            return fn(*a)
        return run

    if stage == "parse":
        real = st.profiles

        class Slow:
            read = staticmethod(held(real.read))

        st.profiles = Slow()  # type: ignore[assignment]
    else:
        monkeypatch.setattr(job_signals, "figures", held(job_signals.figures))
    refresh = threading.Thread(target=st.refresh, args=(recs,), daemon=True)
    refresh.start()
    try:
        assert busy.wait(HANG_CAP_S)
        got: List[str] = []
        scrape = threading.Thread(target=lambda: got.append(scrape_text(st)), daemon=True)
        scrape.start()
        scrape.join(HANG_CAP_S)  # a hang guard: it takes milliseconds
        assert got and not release.is_set(), f"the scrape waited for the {stage}"
        assert 'reason="first-sample"' in got[0]
    finally:
        release.set()
        refresh.join()


def test_heavy_answers_are_their_own_jobs_unknown_and_read_again_after_a_backoff(
        server: Server) -> None:
    """12,000 series, under the 1 MiB size cap: over budget, that job alone; not fetched for
    the next refresh (then two, four...), so it costs one parse now and then."""
    body = heavy(12_000)
    assert len(body) < 1 << 20, "premise: under the size cap"
    server.text("/heavy", lambda: body)
    server.text("/ok", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    st = state(Clock())
    recs = {"66": record("66", f"{server.port}/heavy", uid=A),
            "41": record("41", f"{server.port}/ok", uid=B)}
    st.listeners = lambda: None  # two uids on the test's one server
    st.refresh(recs)
    got = read(st)
    assert got["66"].unknown == (f"latency:{sig.R_OVER_BUDGET}",)
    assert got["66"].p99_ms is None and got["66"].requests is None
    assert got["41"].unknown == ("latency:first-sample",)
    fetched = [server.hits.count("/heavy")]
    for _ in range(4):
        st.refresh(recs)
        fetched.append(server.hits.count("/heavy"))
        assert read(st)["66"].unknown == (f"latency:{sig.R_OVER_BUDGET}",)
    # read at refresh 1; skipped 1 refresh; read at 3; skipped 2; read at 6
    assert fetched == [1, 1, 2, 2, 2]
    assert read(st)["41"].unknown == (), "the other job is read every refresh"


def test_an_answer_over_its_cpu_budget_is_unknown(server: Server) -> None:
    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    ticks = iter(range(0, 10_000, 3))  # every parse costs 3 s of "CPU"
    st = state(Clock(), cpu=lambda: float(next(ticks)))
    st.refresh({"41": record("41", f"{server.port}/metrics")})
    assert read(st)["41"].unknown == (f"latency:{sig.R_OVER_BUDGET}",)


def test_one_users_cpu_budget_is_spent_on_their_own_jobs_only(server: Server) -> None:
    """Each parse costs 0.3 s of "CPU"; a user may spend 0.5 s a refresh: user A's third and
    fourth jobs are over budget, user B's job (listed last) is read, and users take turns."""
    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    ticks = iter([0.3 * i for i in range(1000)])
    st = state(Clock(), cpu=lambda: next(ticks),
               budget=Budget(job_cpu_s=1.0, user_cpu_s=0.5))
    st.listeners = lambda: None
    recs = {str(j): record(str(j), f"{server.port}/metrics", uid=A) for j in range(1, 5)}
    recs["9"] = record("9", f"{server.port}/metrics", uid=B)
    st.refresh(recs)
    got = read(st)
    over = sorted(j for j, js in got.items() if js.unknown == (f"latency:{sig.R_OVER_BUDGET}",))
    assert len(over) == 2 and "9" not in over
    assert got["9"].unknown == ("latency:first-sample",)
    st.refresh(recs)  # the turn moves on: A's jobs over budget are not always the same two
    again = {j for j, js in read(st).items() if js.unknown == (f"latency:{sig.R_OVER_BUDGET}",)}
    assert len(again) >= 2 and again != set(over)


def test_one_users_hanging_endpoints_do_not_make_another_user_miss_the_deadline(
        server: Server) -> None:
    """User A: 130 endpoints that hang (twice the 64 slots of a refresh, and more); user B:
    one good endpoint, listed after them. B's is read on time; A's end at their timeout."""
    server.routes["/hang"] = _hang
    server.text("/ok", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    st = state(Clock())
    st.listeners = lambda: None
    recs: Dict[str, Any] = {str(j): record(str(j), f"{server.port}/hang", uid=A)
                            for j in range(1, 131)}
    recs["999"] = record("999", f"{server.port}/ok", uid=B)
    st.refresh(recs)
    got = read(st)
    assert got["999"].unknown == ("latency:first-sample",), "B's endpoint was read"
    assert server.hanging > 0, "premise: A's endpoints still hang"
    assert {got[str(j)].unknown[0] for j in range(1, 131)} <= {
        "latency:timeout", "latency:deadline"}


def test_one_users_answers_together_are_cut_at_their_memory_budget(server: Server) -> None:
    """Each answer 700 KB (under the 1 MiB cap), a user's answers 1 MiB together: one of
    user A's three is read at most, user B's is read all the same."""
    pad = "".join(f"# padding line {i:07d} " + "x" * 60 + "\n" for i in range(9000))
    body = pad + vllm(cum(1, 2, 3, 4), stop=4)
    assert 600_000 < len(body) < 1 << 20, "premise: each answer is under the size cap"
    server.text("/big", lambda: body)
    st = state(Clock(), budget=Budget(user_bytes=1 << 20))
    st.listeners = lambda: None
    recs = {str(j): record(str(j), f"{server.port}/big", uid=A) for j in (1, 2, 3)}
    recs["9"] = record("9", f"{server.port}/big", uid=B)
    st.refresh(recs)
    got = read(st)
    over = [j for j in "123" if got[j].unknown == (f"latency:{sig.R_OVER_BUDGET}",)]
    assert len(over) >= 2
    assert got["9"].unknown == ("latency:first-sample",), "B's answer is read"


@pytest.mark.parametrize("order", [["1", "2", "3", "4"], ["4", "2", "1", "3"], ["3", "4", "1", "2"]])
def test_a_users_turn_does_not_depend_on_which_answer_came_first(order: List[str]) -> None:
    """Answers arrive in the order their fetches end. The jobs left over budget in a refresh
    are the same whatever that order, and they move on the next refresh."""
    from types import SimpleNamespace

    body = vllm(cum(1, 2, 3, 4), stop=4)
    ticks = iter([0.3 * i for i in range(1000)])
    st = state(Clock(), cpu=lambda: next(ticks), budget=Budget(job_cpu_s=1.0, user_cpu_s=0.5))
    got = {j: SimpleNamespace(body=body, reason="", detail="") for j in order}
    uids = dict.fromkeys(order, A)
    overs = []
    for _ in range(2):
        out, _heavy = st._parse_all(got, uids)
        overs.append({j for j, res in out.items()
                      if isinstance(res, tuple) and res[0] == sig.R_OVER_BUDGET})
    assert overs == [{"4", "1"}, {"1", "2"}]
