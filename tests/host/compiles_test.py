"""The compile ledger: which programs are ready, what a compile costs, and when a width pays."""

from jaxspec.host import compiles


def test_a_program_is_ready_once_it_ran():
    ledger = compiles.CompileLedger()
    assert not ledger.ready("k4")
    ledger.ran("k4", seconds=3.0)
    ledger.ran("k0")
    assert ledger.ready("k4") and ledger.ready("k0") and not ledger.ready("k8")


def test_the_price_is_the_median_measured_compile():
    ledger = compiles.CompileLedger()
    assert ledger.compile_seconds() == 0.0
    for key, seconds in [("a", 8.0), ("b", None), ("c", 2.0), ("d", 5.0)]:
        ledger.ran(key, seconds)
    assert ledger.compile_seconds() == 5.0


def test_nothing_measured_compiles_anything():
    assert compiles.CompileLedger().worth_compiling("k4", lost_per_step=0.0, steps_left=0)


def test_known_remaining_work_that_repays_the_compile_buys_it_at_once():
    ledger = compiles.CompileLedger()
    ledger.ran("k0", seconds=10.0)
    assert not ledger.worth_compiling("k4", lost_per_step=0.1, steps_left=99)
    assert ledger.worth_compiling("k4", lost_per_step=0.1, steps_left=100)


def test_lost_time_accumulates_until_it_reaches_the_price():
    """Ski rental: steps that could not repay the compile alone add up across requests."""
    ledger = compiles.CompileLedger()
    ledger.ran("k0", seconds=1.0)
    decisions = [ledger.worth_compiling("k4", lost_per_step=0.25, steps_left=2)
                 for _ in range(5)]
    assert decisions == [False, False, False, True, True]
    assert not ledger.worth_compiling("k8", lost_per_step=0.25, steps_left=2), "per program"
    ledger.ran("k4", seconds=1.0)
    assert not ledger.worth_compiling("k4", lost_per_step=0.25, steps_left=2), "account closed"


def test_negative_losses_do_not_pay_back():
    ledger = compiles.CompileLedger()
    ledger.ran("k0", seconds=1.0)
    for _ in range(10):
        assert not ledger.worth_compiling("k4", lost_per_step=-1.0, steps_left=100)
    assert ledger.worth_compiling("k4", lost_per_step=0.5, steps_left=0) is False
    assert ledger.worth_compiling("k4", lost_per_step=0.5, steps_left=0) is True


def test_eager_compiles_whatever_is_preferred_and_nests():
    ledger = compiles.CompileLedger()
    ledger.ran("k0", seconds=100.0)
    assert not ledger.is_eager
    with ledger.eager():
        assert ledger.is_eager
        with ledger.eager():
            assert ledger.worth_compiling("k4", lost_per_step=0.0, steps_left=0)
        assert ledger.worth_compiling("k8", lost_per_step=0.0, steps_left=0)
    assert not ledger.worth_compiling("k8", lost_per_step=0.0, steps_left=0)
    assert not ledger.is_eager


def test_forgetting_programs_keeps_the_price():
    ledger = compiles.CompileLedger()
    ledger.ran("k4", seconds=2.0)
    ledger.worth_compiling("k8", lost_per_step=1.0, steps_left=0)
    ledger.forget_programs()
    assert not ledger.ready("k4") and ledger.compile_seconds() == 2.0
    assert not ledger.worth_compiling("k8", lost_per_step=1.0, steps_left=0), "account emptied"
