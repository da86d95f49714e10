"""The per-unit time table printed at the end of every suite run (tests/unit_times.py)."""

from unit_times import UnitTimes


def by_unit(nodeid: str) -> str:
    """Two modules form one unit, as the cluster modules do in tests/conftest.py."""
    module = nodeid.split("::")[0]
    return "cluster" if module.startswith("tests/slurm/") else module


def test_tests_count_towards_the_unit_the_unit_function_gives():
    times = UnitTimes(by_unit)
    for nodeid, seconds in [("tests/slurm/test_a.py::t1", 60.0), ("tests/slurm/test_b.py::t2", 60.0),
                            ("tests/x/test_c.py::t3", 30.0)]:
        times.add(nodeid, seconds)
    assert dict(times.seconds) == {"cluster": 120.0, "tests/x/test_c.py": 30.0}


def test_setup_call_and_teardown_of_one_test_add_up_and_count_it_once():
    times = UnitTimes(by_unit)
    for seconds in (1.0, 2.0, 3.0):
        times.add("tests/x/test_c.py::t", seconds)
    assert times.seconds["tests/x/test_c.py"] == 6.0 and len(times.tests["tests/x/test_c.py"]) == 1


def test_the_table_lists_the_longest_unit_first_and_the_total_last():
    times = UnitTimes(by_unit)
    times.add("tests/x/test_short.py::t", 60.0)
    times.add("tests/x/test_long.py::t", 600.0)
    lines = times.lines()
    assert lines[1].split() == ["10.0", "0.0", "1", "tests/x/test_long.py"]
    assert lines[2].split() == ["1.0", "0.0", "1", "tests/x/test_short.py"]
    assert lines[-1].split()[:3] == ["11.0", "0.0", "2"]


def test_only_the_slowest_units_are_shown_but_the_total_counts_all():
    times = UnitTimes(by_unit)
    for index in range(5):
        times.add(f"tests/x/test_{index}.py::t", 60.0 * (index + 1))
    lines = times.lines(shown=2)
    assert len(lines) == 1 + 2 + 1 and "slowest 2 of 5" in lines[0]
    assert lines[-1].split()[0] == "15.0"


def test_each_unit_shows_its_cpu_minutes_beside_its_wall_minutes_and_the_total_sums_them():
    times = UnitTimes(by_unit)
    times.add("tests/x/test_waits.py::t", 600.0, cpu_seconds=60.0)
    times.add("tests/x/test_computes.py::t", 120.0, cpu_seconds=120.0)
    lines = times.lines()
    assert lines[1].split() == ["10.0", "1.0", "1", "tests/x/test_waits.py"]
    assert lines[2].split() == ["2.0", "2.0", "1", "tests/x/test_computes.py"]
    assert lines[-1].split()[:2] == ["12.0", "3.0"]


def test_cpu_seconds_now_counts_a_waited_child_process():
    import subprocess
    import sys

    from unit_times import cpu_seconds_now

    before = cpu_seconds_now()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert cpu_seconds_now() - before > 0.05


def test_the_tsv_lists_every_test_with_its_unit_time_and_cpu_time_most_cpu_first(tmp_path):
    times = UnitTimes(by_unit)
    times.add("tests/slurm/test_a.py::t1", 50.0, cpu_seconds=1.0)
    times.add("tests/x/test_c.py::t3", 5.0, cpu_seconds=3.0)
    times.add("tests/x/test_c.py::t3", 1.0, cpu_seconds=1.0)
    times.write_tsv(str(tmp_path / "units.tsv"))
    rows = [line.split("\t") for line in (tmp_path / "units.tsv").read_text().splitlines()]
    assert rows == [["unit", "test", "seconds", "cpu_seconds"],
                    ["tests/x/test_c.py", "tests/x/test_c.py::t3", "6.00", "4.00"],
                    ["cluster", "tests/slurm/test_a.py::t1", "50.00", "1.00"]]
