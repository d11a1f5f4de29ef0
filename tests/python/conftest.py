"""pytest under mpiexec: every rank runs the same tests (collectives need
all ranks); tutti is initialised once per process."""
import os
import sys

import pytest

# A build tree's package directory (TUTTI_PYTHONPATH) wins over an installed
# package when ctest points at one.
if os.environ.get("TUTTI_PYTHONPATH"):
    sys.path.insert(0, os.environ["TUTTI_PYTHONPATH"])

import tutti  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (ctest label gpu)")
    tutti.init()


@pytest.fixture(scope="session")
def world():
    return tutti.world()


@pytest.fixture
def rank(world):
    return world.rank


@pytest.fixture
def size(world):
    return world.size
