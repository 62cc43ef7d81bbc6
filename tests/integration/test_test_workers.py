"""scripts/test's two workers keep the groups tests/conftest.py gives: a file on one worker, every real
engine and Ray test on one worker.

pytest-xdist's `--dist loadgroup` reads the groups from a suffix it writes into each test's node id,
and from pytest 9.2 that write silently does nothing (pytest-dev/pytest-xdist#1386): the tests are
then spread one by one, two real vLLM engines start at once on two cores, and a module's fixtures
start on both workers. Nothing fails loudly when that happens, so this runs a small suite under
the same options, with this repository's conftest, and reads back which worker ran what.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import HEAVY_GROUP, REPO_ROOT

PLAIN = "\n".join(f"def test_plain_{index}():\n    pass\n" for index in range(6))
HEAVY = """
import pytest

@pytest.mark.engine
def test_on_the_engine():
    pass

@pytest.mark.ray
def test_on_ray():
    pass

def test_beside_them():
    pass
"""
OTHER_HEAVY = """
import pytest

@pytest.mark.engine
def test_on_the_engine_elsewhere():
    pass
"""
RESULT = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)[ \t]*$", re.MULTILINE)


def test_loadgroup_keeps_a_file_and_the_real_engine_tests_each_on_one_worker(tmp_path: Path) -> None:
    for name, text in (("test_plain.py", PLAIN), ("test_heavy.py", HEAVY), ("test_other_heavy.py", OTHER_HEAVY)):
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = RESULT.findall(done.stdout)
    assert len(ran) == 10, done.stdout[-3000:]
    workers_by_group: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in ran:
        test, at, group = nodeid.rpartition("@")
        assert at, f"{nodeid} carries no group: --dist loadgroup is not grouping (pytest-dev/pytest-xdist#1386)"
        workers_by_group[group].add(worker)
        heavy = test.endswith(("test_on_the_engine", "test_on_ray", "test_on_the_engine_elsewhere"))
        assert group == (HEAVY_GROUP if heavy else test.split("::")[0]), nodeid
    assert set(workers_by_group) == {HEAVY_GROUP, "test_plain.py", "test_heavy.py"}
    assert all(len(workers) == 1 for workers in workers_by_group.values()), dict(workers_by_group)
