"""Unit tests of the job wrapper's parts: signal flags, requeue decisions, the marker
protocol, the resume record, the prolog record, and the program-side helper."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, List, Optional, Sequence

import pytest

from slurmiso import checkpoint
from slurmiso.errors import SlurmError, UsageError
from slurmiso.wrapper import requeue
from slurmiso.wrapper.checkpoint_protocol import (
    BadMarker,
    MarkerWatcher,
    Report,
    read_marker,
    verify,
    write_marker,
)
from slurmiso.wrapper.record import JobRecord, isolation_env, read_job_record, refusal
from slurmiso.wrapper.resume import CheckpointStore, default_ckpt_dir, resume_env
from slurmiso.wrapper.signals import (
    PREEMPTED,
    TIME_LIMIT,
    JobEnvironment,
    SignalHandler,
    parse_signal,
)

TERM, USR1 = int(signal.SIGTERM), int(signal.SIGUSR1)

# -- signals -------------------------------------------------------------------------------


def _handler() -> SignalHandler:
    return SignalHandler(JobEnvironment(job_id="7"), {TERM: PREEMPTED, USR1: TIME_LIMIT})


def test_handler_only_sets_flags_and_first_cause_wins() -> None:
    h = _handler()
    h.handle(USR1)
    h.handle(TERM)
    h.handle(TERM)
    assert (h.stop_cause, h.stop_signum, h.stop_count) == (TIME_LIMIT, USR1, 3)


def test_handler_queues_forwarded_signals_once() -> None:
    h = _handler()
    h.handle(int(signal.SIGINT))
    h.handle(int(signal.SIGHUP))
    h.handle(int(signal.SIGCHLD))  # only a wake-up, never forwarded
    assert h.take_forward() == [int(signal.SIGINT), int(signal.SIGHUP)]
    assert h.take_forward() == []
    assert h.stop_cause is None


def test_installed_handler_wakes_the_loop_at_once_and_restores() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with _handler() as h:
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        h.wait(600.0)
        # a handler that did not wake the loop would sleep the whole 600 s; woken, it returns
        # in microseconds: 60 s tells the two apart on any machine (a hang guard, no speed)
        assert time.monotonic() - t0 < 60.0
        assert h.stop_cause == TIME_LIMIT
    assert signal.getsignal(signal.SIGUSR1) == before


@pytest.mark.parametrize(
    "text, expected",
    [("USR2", signal.SIGUSR2), ("sigusr1", signal.SIGUSR1), ("15", signal.SIGTERM)],
)
def test_parse_signal(text: str, expected: signal.Signals) -> None:
    assert parse_signal(text) == expected


def test_parse_signal_names_the_choices() -> None:
    with pytest.raises(UsageError, match="unknown signal 'BOGUS'"):
        parse_signal("BOGUS")


def test_job_environment_from_env() -> None:
    job = JobEnvironment.from_env(
        {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "3", "SLURM_PROCID": "2"}
    )
    assert (job.job_id, job.restart_count, job.procid, job.in_slurm) == ("12", 3, 2, True)
    local = JobEnvironment.from_env({"SLURM_RESTART_COUNT": "x"})
    assert (local.in_slurm, local.restart_count) == (False, 0)


# -- requeue decisions ---------------------------------------------------------------------

CASES = [
    # cause, job, restarts, max, ckpt ok, status, requeue?, by, reason fragment
    (PREEMPTED, "9", 0, 20, True, None, True, "slurmiso", "need not wait out the grace"),
    (PREEMPTED, "9", 25, 20, False, None, True, "slurmiso", "preempted"),  # not bounded
    (TIME_LIMIT, "9", 0, 20, True, None, True, "slurmiso", "time limit"),
    (TIME_LIMIT, "9", 20, 20, True, None, False, "", "max_requeues (20)"),
    (TIME_LIMIT, "9", 1, 20, False, None, False, "", "no checkpoint was taken"),
    (TIME_LIMIT, "", 0, 20, True, None, False, "", "not running under Slurm"),
    (PREEMPTED, "", 0, 20, True, None, False, "", "not running under Slurm"),
    (PREEMPTED, "9", 0, 20, False, 0, False, "", "finished (exit 0)"),
]


def test_cancelled_job_is_never_requeued() -> None:
    d = requeue.decide(PREEMPTED, job_id="9", restart_count=0, max_requeues=20,
                       checkpoint_ok=True, slurm_state="CANCELLED")
    assert not d.requeue and "cancelled, not preempted" in d.reason
    running = requeue.decide(PREEMPTED, job_id="9", restart_count=0, max_requeues=20,
                             checkpoint_ok=True, slurm_state="RUNNING")
    assert running.requeue
    # a running job while slurmctld delivers the preemption's SIGCONT (26.05.5, measured)
    signaling = requeue.decide(PREEMPTED, job_id="9", restart_count=0, max_requeues=20,
                               checkpoint_ok=True, slurm_state="SIGNALING")
    assert signaling.requeue


@pytest.mark.parametrize("state", ["REQUEUED", "REQUEUE_HOLD", "PENDING"])
def test_a_job_requeued_by_someone_else_is_not_called_cancelled(state: str) -> None:
    """The monitor's ladder (or an admin) ran scontrol requeue: its SIGTERM reads as a
    preemption, Slurm shows the job back in the queue. No second requeue, and the reason
    says what happened (the audit matches it with the monitor's line)."""
    d = requeue.decide(PREEMPTED, job_id="9", restart_count=0, max_requeues=20,
                       checkpoint_ok=True, slurm_state=state)
    assert not d.requeue and "cancelled" not in d.reason
    assert f"Slurm shows the job {state}: someone requeued it already" in d.reason


def test_completing_is_not_called_a_cancellation() -> None:
    """Measured on the 22.05 sandbox: right after the monitor's scontrol requeue the wrapper
    reads COMPLETING, as it would after a scancel: the reason names both, never just one."""
    d = requeue.decide(PREEMPTED, job_id="9", restart_count=0, max_requeues=20,
                       checkpoint_ok=True, slurm_state="COMPLETING")
    assert not d.requeue and "cancelled, not preempted" not in d.reason
    assert "cancelled it, or requeued it" in d.reason


def test_slurm_job_state_reads_squeue_fields_and_tolerates_failure() -> None:
    class Show(FakeSlurm):
        def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
                env: Any = None) -> str:
            super().run(cmd, args, timeout)
            return "CANCELLED".ljust(63) + "\n"

    show = Show()
    assert requeue.slurm_job_state(show, "9") == "CANCELLED"
    assert show.calls[0][:2] == ["squeue", "-h"] and "State:64" in show.calls[0]
    assert requeue.slurm_job_state(FakeSlurm(fail=True), "9") == ""


def test_a_comment_naming_a_state_cannot_move_the_wrappers_decision() -> None:
    """Issue 27: the wrapper read JobState from 'scontrol show job -o', where the job's own
    --comment "JobState=RUNNING" stood beside Slurm's keys. It asks squeue for the field."""

    class Forged(FakeSlurm):
        def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
                env: Any = None) -> str:
            super().run(cmd, args, timeout)
            if cmd == "scontrol":
                return "JobId=9 JobState=CANCELLED Comment=x JobState=RUNNING\n"
            return "CANCELLED".ljust(63) + "\n"

    forged = Forged()
    assert requeue.slurm_job_state(forged, "9") == "CANCELLED"
    assert all(call[0] != "scontrol" for call in forged.calls)


@pytest.mark.parametrize("cause, job, rc, mx, ok, status, want, by, why", CASES)
def test_requeue_decision_always_has_a_reason(
    cause: str, job: str, rc: int, mx: int, ok: bool, status: Optional[int],
    want: bool, by: str, why: str,
) -> None:
    d = requeue.decide(
        cause, job_id=job, restart_count=rc, max_requeues=mx, checkpoint_ok=ok,
        program_status=status,
    )
    assert (d.requeue, d.by) == (want, by)
    assert why in d.reason
    if want:
        assert d.count == rc + 1


class FakeSlurm:
    def __init__(self, fail: bool = False) -> None:
        self.calls: List[List[str]] = []
        self.fail = fail

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Any = None) -> str:
        self.calls.append([cmd, *args])
        if self.fail:
            raise SlurmError("scontrol requeue 9 failed: Access/permission denied")
        return ""


def test_scontrol_requeue_calls_slurm_and_reports_failure_as_reason() -> None:
    ok = FakeSlurm()
    assert requeue.scontrol_requeue(ok, "9") is None
    assert ok.calls == [["scontrol", "requeue", "9"]]
    why = requeue.scontrol_requeue(FakeSlurm(fail=True), "9")
    assert why is not None and "permission denied" in why


# -- marker protocol -----------------------------------------------------------------------


def test_marker_round_trip_and_each_report_seen_once(tmp_path) -> None:
    marker = str(tmp_path / ".slurmiso" / "marker.json")
    ckpt = tmp_path / "step-5.pt"
    ckpt.write_bytes(b"x" * 100)
    watcher = MarkerWatcher(marker)
    assert watcher.poll() is None
    write_marker(marker, str(ckpt), step=5)
    report = watcher.poll()
    assert report is not None and (report.path, report.step) == (str(ckpt), 5)
    assert watcher.poll() is None
    write_marker(marker, str(ckpt), step=5)  # reported again: a new report
    assert watcher.poll() is not None
    assert verify(report) == (True, 100, "")


def test_marker_as_plain_text_relative_to_the_checkpoint_dir(tmp_path) -> None:
    (tmp_path / ".slurmiso").mkdir()
    marker = tmp_path / ".slurmiso" / "marker.json"
    marker.write_text("ckpt/last.bin\n")
    report = read_marker(str(marker))
    assert report is not None and report.path == str(tmp_path / "ckpt" / "last.bin")


@pytest.mark.parametrize("content", ["", '{"path": "/x", "st', '{"step": 3}', '{"path": ""}'])
def test_unreadable_marker_is_rejected_not_guessed(tmp_path, content: str) -> None:
    marker = tmp_path / "marker.json"
    marker.write_text(content)
    with pytest.raises(BadMarker):
        read_marker(str(marker))
    assert MarkerWatcher(str(marker)).poll() is None  # half-written: try again later


def test_report_of_a_missing_checkpoint_is_not_ok(tmp_path) -> None:
    ok, size, why = verify(Report(str(tmp_path / "gone.pt"), 3, "i"))
    assert (ok, size) == (False, 0) and "does not exist" in why


# -- resume ----------------------------------------------------------------------------------


def test_store_records_atomically_and_offers_only_existing_checkpoints(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.read() is None
    ckpt = tmp_path / "step-9.json"
    ckpt.write_text("{}")
    store.record(Report(str(ckpt), 9, "a"), 2, restart_count=1)
    latest = store.read()
    assert latest is not None and (latest.path, latest.step, latest.ident) == (str(ckpt), 9, "a")
    assert not [n for n in os.listdir(store.meta_dir) if ".tmp" in n]
    ckpt.unlink()
    assert store.read() is None  # vanished: never offered


@pytest.mark.parametrize("content", ["", "{not json", '{"step": 4}', '{"path": 5, "bytes": "x"}'])
def test_corrupt_latest_is_never_offered(tmp_path, content: str) -> None:
    store = CheckpointStore(str(tmp_path))
    store.ensure()
    with open(store.latest_path, "w") as fh:
        fh.write(content)
    assert store.read() is None


def test_half_written_checkpoint_without_report_is_never_offered(tmp_path) -> None:
    """The program crashed mid-save: it never reported, so the previous one stays."""
    store = CheckpointStore(str(tmp_path))
    good = tmp_path / "step-1.json"
    good.write_text('{"step": 1}')
    store.record(Report(str(good), 1, "a"), 11, 0)
    (tmp_path / "step-2.json.tmp").write_text('{"st')  # the crash
    watcher = MarkerWatcher(store.marker, store.read().ident)  # type: ignore[union-attr]
    assert watcher.poll() is None
    assert store.read().path == str(good)  # type: ignore[union-attr]


def test_resume_env_and_default_dir(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path))
    env = resume_env(store, None, 2, "USR2", 0)
    assert env["SLURMISO_RESUME"] == "" and env["SLURMISO_RESTART_COUNT"] == "2"
    assert env["SLURMISO_CKPT_MARKER"] == store.marker
    assert default_ckpt_dir({}, "77", "/w") == "/w/slurmiso-ckpt/77"
    assert default_ckpt_dir({"SLURMISO_CKPT_DIR": "/s/x"}, "77", "/w") == "/s/x"


# -- prolog record -------------------------------------------------------------------------


def test_record_env_is_filtered_and_class_exported() -> None:
    rec = JobRecord.from_dict(
        {
            "status": "ready",
            "class": "train",
            "env": {"CUDA_VISIBLE_DEVICES": "MIG-abc", "bad name": "x", "X": "a\nb"},
        }
    )
    assert isolation_env(rec) == {"CUDA_VISIBLE_DEVICES": "MIG-abc", "SLURMISO_CLASS": "train"}
    assert refusal(rec, {}) == ""


def test_refusal_from_record_or_task_prolog_mark() -> None:
    rec = JobRecord.from_dict({"status": "refused", "reason": "profile  4g.40gb\ndoes not fit"})
    assert refusal(rec, {}) == "profile 4g.40gb does not fit"
    assert isolation_env(rec) == {}
    assert refusal(None, {"SLURMISO_REFUSED": "no class"}) == "no class"
    assert refusal(None, {}) == ""


class _Cfg:
    class paths:  # noqa: N801 - mimics Config.paths
        state_dir = ""

        @classmethod
        def state_dir_for(cls, node: str) -> str:
            return cls.state_dir.replace("%n", node)


def test_read_job_record_from_the_state_dir(tmp_path) -> None:
    jobs = tmp_path / "n1" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "55.json").write_text(json.dumps({"schema": 1, "status": "ready", "env": {"A": "1"}}))
    _Cfg.paths.state_dir = str(tmp_path / "%n")
    rec = read_job_record(_Cfg, "55", "n1")
    assert rec is not None and rec.env == {"A": "1"}
    assert read_job_record(_Cfg, "56", "n1") is None
    assert read_job_record(None, "55", "n1") is None


# -- the program-side helper ---------------------------------------------------------------


def test_helper_request_flag_and_report(tmp_path, monkeypatch) -> None:
    marker = tmp_path / ".slurmiso" / "marker.json"
    monkeypatch.setenv("SLURMISO_CKPT_MARKER", str(marker))
    monkeypatch.setenv("SLURMISO_CKPT_SIGNAL", "USR2")
    before = signal.getsignal(signal.SIGUSR2)
    with checkpoint.on_request() as req:
        assert not req.pending
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)  # two requests, one checkpoint
        assert req.pending and req.count == 2
        req.done(str(tmp_path / "c.pt"), step=4)
        assert not req.pending
    assert signal.getsignal(signal.SIGUSR2) == before
    report = read_marker(str(marker))
    assert report is not None and report.step == 4
    assert not [n for n in os.listdir(marker.parent) if n.endswith(".tmp")]


def test_helper_resume_values(monkeypatch) -> None:
    monkeypatch.setenv("SLURMISO_RESUME", "/c/step-3.pt")
    monkeypatch.setenv("SLURMISO_RESUME_STEP", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURMISO_RESTART_COUNT", "9")  # the wrapper's copy, for other languages
    assert checkpoint.resume_path() == "/c/step-3.pt"
    assert (checkpoint.resume_step(), checkpoint.restart_count()) == (3, 2)
    monkeypatch.setenv("SLURMISO_RESUME", "")
    assert checkpoint.resume_path() is None


def test_helper_outside_the_wrapper_just_clears(monkeypatch) -> None:
    monkeypatch.delenv("SLURMISO_CKPT_MARKER", raising=False)
    req = checkpoint.Request()
    req._pending = True
    req.done("/nowhere")
    assert not req.pending


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_refuses_a_refused_job_without_starting_it(tmp_path, monkeypatch, capsys) -> None:
    from slurmiso.cli.main import main

    monkeypatch.setenv("SLURM_JOB_ID", "31")
    monkeypatch.setenv("SLURMISO_CONFIG", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("SLURMISO_REFUSED", "class train needs mps isolation")
    flag = tmp_path / "ran"
    rc = main(["run", "--ckpt-dir", str(tmp_path / "c"), "--", "touch", str(flag)])
    assert rc == 1 and not flag.exists()
    assert "job 31 was refused" in capsys.readouterr().err


def test_cli_passes_the_exit_status_through(tmp_path, monkeypatch) -> None:
    from slurmiso.cli.main import main

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURMISO_REFUSED", raising=False)
    rc = main(["run", "--ckpt-dir", str(tmp_path / "c"), "--", "sh", "-c", "exit 4"])
    assert rc == 4
    assert main(["run"]) == 2  # no program: usage error


@pytest.mark.parametrize("name", ["KILL", "CHLD", "SEGV"])
def test_a_stop_signal_the_wrapper_cannot_catch_is_a_usage_error(name: str) -> None:
    with pytest.raises(UsageError, match=f"SIG{name} cannot be the signal that stops the job"):
        SignalHandler(JobEnvironment(), {TERM: PREEMPTED, int(parse_signal(name)): TIME_LIMIT})


def test_preempted_job_is_left_to_the_epilog_only_where_it_requeues() -> None:
    """Issue 14: a requeue from inside the step costs the preempting job 2.3 s (see
    wrapper/requeue.py); where slurmiso's epilog requeues, the wrapper only asks."""
    common = dict(job_id="7", restart_count=2, max_requeues=20, checkpoint_ok=True)
    d = requeue.decide(PREEMPTED, slurm_state="RUNNING", epilog=True, **common)  # type: ignore[arg-type]
    assert (d.requeue, d.by, d.count) == (True, requeue.BY_EPILOG, 3)
    d = requeue.decide(PREEMPTED, slurm_state="RUNNING", **common)  # type: ignore[arg-type]
    assert (d.requeue, d.by) == (True, requeue.BY_WRAPPER)
    d = requeue.decide(PREEMPTED, slurm_state="CANCELLED", epilog=True, **common)  # type: ignore[arg-type]
    assert not d.requeue and "cancelled" in d.reason
    d = requeue.decide(TIME_LIMIT, epilog=True, **common)  # type: ignore[arg-type]
    assert d.by == requeue.BY_WRAPPER  # nobody else requeues before a time limit


def test_job_environment_reads_the_epilog_requeue_declaration() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMISO_EVENTS_FILE": "/w/.e", "SLURMISO_EPILOG_REQUEUE": "1"}
    job = JobEnvironment.from_env(env)
    assert (job.events_file, job.epilog_requeue) == ("/w/.e", True)
    assert not JobEnvironment.from_env({**env, "SLURMISO_EPILOG_REQUEUE": "yes"}).epilog_requeue


def test_an_events_file_past_the_epilogs_cap_is_said_in_the_jobs_log(
    tmp_path: Any, caplog: Any
) -> None:
    """Issue 22: events past the epilog's read cap were lost with no word in the job's log."""
    from slurmiso.hooks.events import MAX_BYTES
    from slurmiso.state import Journal
    from slurmiso.wrapper.supervisor import Events

    path = tmp_path / "events.jsonl"
    path.write_bytes(b"x" * (MAX_BYTES + 10))  # something else filled the job's file
    events = Events(Journal(str(path)))
    with caplog.at_level("WARNING"):
        assert events.emit("checkpoint-end", ok=True)
        assert events.emit("checkpoint-end", ok=True)
    said = [r.getMessage() for r in caplog.records if "over the" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and str(MAX_BYTES) in said[0]
