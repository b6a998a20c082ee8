"""``tools/gpu_clock.py``: nvidia-smi's samples read, cut into a phase's window, and the sampler's child
process started and stopped (a stand-in executable that prints the tool's line format, on the CPU)."""
from __future__ import annotations

import datetime
import shutil
import stat
import sys
import time

import pytest

from lingbot_map_ros.tools.bench_streams import clock_cell, clock_fields
from lingbot_map_ros.tools.gpu_clock import (
    ClockSample,
    ClockSampler,
    ClockWindow,
    describe_reasons,
    parse_sample,
    window,
)


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_a_line_of_the_tool_is_read_with_its_own_timestamp():
    t = 1796650634.5
    sample = parse_sample(f"{_stamp(t)}, 1852, 690.89, 0x0000000000000004\n")
    assert sample is not None
    assert abs(sample.time - t) < 1e-3
    assert (sample.sm_mhz, sample.power_w, sample.reasons) == (1852.0, 690.89, 4)


@pytest.mark.parametrize("line", [
    "timestamp, clocks.current.sm [MHz], power.draw [W], clocks_throttle_reasons.active",  # a header
    "2026/12/07 13:36:33.804, 345, [N/A], 0x0000000000000001",  # a field the card does not report
    "2026/12/07 13:36:33.804, [Not Supported], 74.8, 0x1",
    "No devices were found",
    "",
])
def test_lines_that_are_not_samples_are_skipped(line):
    assert parse_sample(line) is None


def test_a_window_takes_the_medians_of_its_samples_and_every_reason_seen():
    samples = [ClockSample(10.0, 1980, 300, 0x0), ClockSample(11.0, 1950, 681, 0x4), ClockSample(12.0, 1800, 700, 0x4),
               ClockSample(13.0, 1900, 690, 0x8), ClockSample(20.0, 345, 75, 0x1)]
    w = window(samples, 11.0, 13.0)
    assert w == ClockWindow(3, 1900, 690, 0x4 | 0x8)
    assert w.reason_names() == "power cap+hardware slowdown"
    assert window(samples, 14.0, 19.0) is None  # nothing sampled then


def test_reasons_are_named_and_unknown_bits_kept():
    assert describe_reasons(0) == "none"
    assert describe_reasons(0x4) == "power cap"
    assert describe_reasons(0x1 | 0x4) == "idle+power cap"
    assert describe_reasons(0x4 | 0x400) == "power cap+0x400"


def test_the_sampler_reads_its_child_and_stops_it(tmp_path):
    tool = tmp_path / "fake-smi"
    tool.write_text(f"#!{sys.executable}\n"
                    "import datetime, sys, time\n"
                    "assert '-i' in sys.argv and sys.argv[sys.argv.index('-i') + 1] == 'GPU-test'\n"
                    "for clock in range(1000, 100000):\n"
                    "    now = datetime.datetime.now().strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]\n"
                    "    print(f'{now}, {clock}, 500.0, 0x0000000000000004', flush=True)\n"
                    "    time.sleep(0.02)\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    with ClockSampler("GPU-test", period_ms=20, executable=str(tool)) as clocks:
        start = time.time()
        deadline = start + 10
        while len(clocks.samples) < 5 and time.time() < deadline:
            time.sleep(0.02)
        end = time.time()
    proc = clocks._proc
    assert proc is not None and proc.poll() is not None, "the child must be stopped when the sampler closes"
    got = clocks.between(start - 1, end + 1)
    assert got is not None and got.samples >= 5 and got.power_w == 500.0 and got.reason_names() == "power cap"
    assert got.sm_mhz > 1000  # the clocks the child printed, in order
    count = len(clocks.samples)
    time.sleep(0.1)
    assert len(clocks.samples) == count  # nothing is read after it stopped


def test_without_the_tool_or_a_gpu_nothing_is_sampled(tmp_path):
    for sampler in (ClockSampler("0", executable=str(tmp_path / "absent")), ClockSampler.of("cpu")):
        with sampler as clocks:
            pass
        assert clocks.between(0, time.time()) is None and clocks._proc is None


def test_a_streams_row_carries_each_phase_clock_and_prints_it():
    w = ClockWindow(14, 1852.5, 690.89, 0x4)
    assert clock_fields(w, "one_stream_") == {"one_stream_sm_mhz": 1852, "one_stream_power_w": 691,
                                             "one_stream_clock_limits": "power cap"}
    assert clock_fields(None, "") == {}
    assert clock_cell(w) == "1852 MHz, 691 W (power cap)" and clock_cell(None) == "-"


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="the real tool is on GPU hosts only")
def test_the_real_tool_gives_samples_of_the_first_gpu():
    with ClockSampler("0", period_ms=50) as clocks:
        time.sleep(0.5)
    assert clocks.samples and all(s.sm_mhz > 0 for s in clocks.samples)
