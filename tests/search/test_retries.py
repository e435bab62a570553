"""What a trial runs again after (``record/retries.py``): a lost node never counts against
``max_failures``, the trial's own process failures do, and one loss Tune reports several times
is one rerun."""

from __future__ import annotations

from raysearch.search.record.retries import NODE_LOSS_RETRIES, RetryLog, tune_max_failures

CRASH = "TrialCrashed: the trial's process (pid 7) died unexpectedly: killed"
BROKE = (
    "TrialUnreachable: the connection to the trial's process broke: its node was lost or the "
    "process was killed (Ray: RPC error: Socket closed)"
)
LOST = "NodeLost: the node running this trial (728b6da40bde, 10.0.0.2) was lost"


def test_node_losses_do_not_use_up_max_failures():
    log = RetryLog(None, max_failures=0)
    assert log.failed("t", BROKE) is None  # runs again though max_failures is 0
    assert log.failed("t", CRASH) == CRASH  # its own failure: max_failures (0) used up
    assert log.fields("t") == {"retries": 1, "retried_after": BROKE}
    assert tune_max_failures(0) == NODE_LOSS_RETRIES


def test_one_loss_reported_three_times_is_one_rerun():
    log = RetryLog(None, max_failures=1)
    for line in (BROKE, LOST, LOST):
        assert log.failed("t", line) is None
    assert log.fields("t")["retries"] == 1
    assert log.failed("t", CRASH) is None  # one own failure is within max_failures 1
    assert log.failed("t", CRASH) == CRASH
    assert log.fields("t") == {"retries": 2, "retried_after": f"{BROKE} | {CRASH}"}


def test_a_trial_never_run_again_has_no_retries():
    assert RetryLog(None).fields("t") == {"retries": 0, "retried_after": None}
