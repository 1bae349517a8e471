"""``/proc/pressure/*`` (kernel ``Documentation/accounting/psi.rst``, ``kernel/sched/psi.c``
``psi_show``): the ``some`` and ``full`` lines of real files copied from this machine, converted
to ratios and seconds; a kernel's cpu file without ``full`` (before 5.13); truncated and garbled
lines skipped; and this machine's own file read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import FIXTURES

from laggard.parsers.pressure import PressureLine, parse_pressure

DIR = FIXTURES / "proc" / "pressure"


def test_a_real_cpu_file_gives_some_and_full_as_ratios_and_seconds():
    text = (DIR / "cpu").read_text()
    parsed = parse_pressure(text.splitlines())
    assert set(parsed) == {"some", "full"}
    some = parsed["some"]
    fields = dict(item.split("=") for item in text.splitlines()[0].split()[1:])
    assert some.avg10_ratio == pytest.approx(float(fields["avg10"]) / 100)
    assert some.avg300_ratio == pytest.approx(float(fields["avg300"]) / 100)
    assert some.total_seconds == pytest.approx(int(fields["total"]) / 1e6)
    # the system-wide CPU "full" line is undefined and reads 0 (psi.rst)
    assert parsed["full"] == PressureLine(0.0, 0.0, 0.0, 0.0)


def test_a_real_io_file_has_a_full_line_of_its_own():
    parsed = parse_pressure((DIR / "io").read_text().splitlines())
    assert 0 < parsed["full"].total_seconds <= parsed["some"].total_seconds


def test_a_cpu_file_of_a_kernel_before_5_13_has_some_only():
    assert set(parse_pressure(["some avg10=1.50 avg60=0.25 avg300=0.00 total=1234567"])) == {
        "some"}
    assert parse_pressure(["some avg10=1.50 avg60=0.25 avg300=0.00 total=1234567"])[
        "some"] == PressureLine(0.015, 0.0025, 0.0, 1.234567)


@pytest.mark.parametrize("line", [
    "some avg10=1.50 avg60=0.25 avg3",  # a read cut mid-line
    "some avg10=1.50 avg60=0.25 avg300=0.00",  # no total
    "some avg10=x avg60=0.25 avg300=0.00 total=1",  # not a number
    "some avg10=nan avg60=0.25 avg300=0.00 total=1",  # not finite
    "some avg10=-1 avg60=0.25 avg300=0.00 total=1",  # negative
    "some avg10 1.50 avg60=0.25 avg300=0.00 total=1",  # no '='
    "partial avg10=1.50 avg60=0.25 avg300=0.00 total=1",  # not a kind psi.rst has
    "",
])
def test_malformed_lines_are_skipped(line):
    good = "full avg10=0.00 avg60=0.00 avg300=0.00 total=0"
    assert parse_pressure([line, good]) == {"full": PressureLine(0.0, 0.0, 0.0, 0.0)}


def test_a_field_a_later_kernel_might_add_is_ignored():
    parsed = parse_pressure(["some avg10=2.00 avg60=1.00 avg300=0.50 total=10 avg1=3.0"])
    assert parsed["some"].avg10_ratio == 0.02


def test_this_machines_cpu_file_when_the_kernel_has_psi():
    path = Path("/proc/pressure/cpu")
    try:
        text = path.read_text()
    except OSError:
        pytest.skip("no PSI on this kernel (CONFIG_PSI off or psi=0)")
    some = parse_pressure(text.splitlines())["some"]
    assert 0 <= some.avg10_ratio <= 1 and some.total_seconds > 0
