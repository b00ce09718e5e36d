"""profilers.host_activity: the share of the host others took while we measured."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from profilers import host_activity as ha

TICK = 100.0


def stat(path: Path, per_cpu: list[tuple[int, int, int]]) -> Path:
    """A /proc/stat whose CPU i spent per_cpu[i] = (user, system, steal) clock ticks."""
    # cpuN  user nice system idle iowait irq softirq steal guest guest_nice (clock ticks)
    lines = [
        f"cpu  {sum(u for u, _, _ in per_cpu)} 0 {sum(s for _, s, _ in per_cpu)} 0 0 0 0 "
        f"{sum(t for _, _, t in per_cpu)} 0 0"
    ]
    lines += [f"cpu{i} {u} 0 {s} 9 0 0 0 {t} 0 0" for i, (u, s, t) in enumerate(per_cpu)]
    lines += ["intr 1 2 3", "ctxt 10"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_counters_are_read_in_seconds_over_the_cpus_we_may_use(tmp_path: Path) -> None:
    path = stat(tmp_path / "stat", [(100, 50, 10), (200, 50, 40), (1000, 0, 0), (7, 0, 0)])
    tick = float(ha.os.sysconf("SC_CLK_TCK"))
    counters = ha.read_counters(path, allowed={0, 1})
    assert counters is not None
    assert counters.busy_s == pytest.approx(400 / tick)  # CPUs 2 and 3 are someone else's
    assert counters.steal_s == pytest.approx(50 / tick)
    assert counters.cpus == 2
    every = ha.read_counters(path, allowed={0, 1, 2, 3})
    assert every is not None and every.cpus == 4
    assert every.busy_s == pytest.approx(1407 / tick)
    assert ha.read_counters(path, allowed={9}) is None  # none of ours listed
    assert ha.read_counters(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("cpu  1 2 3\ncpu0 a b c d e f g h\n")
    assert ha.read_counters(tmp_path / "odd") is None


def test_others_share_is_the_busy_time_we_did_not_spend_plus_steal() -> None:
    before = ha._Counters(busy_s=10.0, steal_s=1.0, cpus=2)
    after = ha._Counters(busy_s=13.0, steal_s=1.5, cpus=2)
    # 2 s on 2 CPUs = 4 CPU-seconds; 3 busy, of which we spent 2: others 1 + steal 0.5.
    got = ha.activity_between(before, after, own_s=2.0, wall_s=2.0)
    assert got is not None
    assert got.others_share == pytest.approx(1.5 / 4)
    assert got.steal_share == pytest.approx(0.5 / 4)
    # Ticks round: we may seem to have spent more than the host was busy; never below 0.
    quiet = ha.activity_between(before, after, own_s=5.0, wall_s=2.0)
    assert quiet is not None and quiet.others_share == pytest.approx(0.5 / 4)
    assert ha.activity_between(before, after, own_s=0.0, wall_s=0.0) is None
    other_host = ha._Counters(busy_s=13.0, steal_s=1.5, cpus=4)
    assert ha.activity_between(before, other_host, own_s=0.0, wall_s=1.0) is None


def test_the_meter_reports_nothing_where_the_counters_cannot_be_read(tmp_path: Path) -> None:
    with ha.HostMeter(tmp_path / "missing") as meter:
        pass
    assert meter.activity is None


@pytest.mark.skipif(not ha.PROC_STAT.is_file(), reason="no /proc/stat on this platform")
def test_a_process_burning_a_core_meanwhile_is_someone_elses_work() -> None:
    """A busy process not reaped before the window closes is counted as others' (about one
    core of the host: noise from the rest of the machine only adds to it)."""
    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"]
    )
    try:
        time.sleep(0.3)  # it has started
        with ha.HostMeter() as meter:
            time.sleep(1.0)
    finally:
        burner.kill()
        burner.wait()
    assert meter.activity is not None
    assert meter.activity.others_share * meter.activity.cpus >= 0.5
    assert 0.0 <= meter.activity.others_share <= 1.0
