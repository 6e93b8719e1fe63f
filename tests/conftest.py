"""Shared pytest fixtures. The test-bed ones are thin: the code is in tests/testbed.py.

Test-bed fixtures (session-scoped, idempotent, skip cleanly when not root):
- ``testbed``: sshd hosts + dockerd + the base image -> testbed.Testbed
- ``testbed_sshd``: sshd hosts only (no Docker) -> testbed.Testbed
- ``testbed_faults`` (function): stop/start/rekey hosts and docker-group changes,
  all undone when the test ends.
Tests using them are marked ``@pytest.mark.slow`` plus ``sshd`` and/or ``docker``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import lanes
import pytest

try:
    import testbed as _tb  # tests/ is on sys.path (rootdir conftest, no __init__.py)
except ImportError:  # pragma: no cover - if tests/ ever becomes a package
    from tests import testbed as _tb  # type: ignore[no-redef]

# The first test that sets the bed up on a fresh machine pays for apt, debootstrap and
# the torch layer (5-10 min on 2 cores); give the first test of each bed fixture more than
# the default timeout (`make test` runs `testbed.py up` first, so there it is quick anyway).
_FIRST_SETUP_TIMEOUT_S = 1800


@pytest.fixture(autouse=True)
def _keep_the_umask() -> Iterator[None]:
    """Give back the umask a test found: an in-process ``start_run`` sets 0077 for the whole
    process (the node's invoker wants it), and a later test writing files another user must
    read (the Slurm journey's placed checkpoint) then failed only in the full suite."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


_LANE = pytest.StashKey[lanes.Held]()


def _past_the_end() -> None:
    """No test starts after ``HF_TESTS_END_BY`` (epoch seconds; ``.ci/run`` sets it short of CI's limit): the lane
    stops and prints its report, failures included, where CI killing it at its limit would lose the second
    lane's (``make test`` prints that one last)."""
    end = os.environ.get("HF_TESTS_END_BY", "")
    if end.isdigit() and time.time() > int(end):
        pytest.exit("HF_TESTS_END_BY passed: the tests not run yet are not started, so that this lane's "
                    "report is printed before CI's limit", returncode=3)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)   # outside pytest-timeout's timer: waiting is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Every test runs beside the other lane's, but never beside a quiet test's call (tests/lanes.py)."""
    _past_the_end()
    with lanes.shared() as held:
        item.stash[_LANE] = held
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What the quiet tests cost this lane (docs/benchmarks.md, "The developer loop")."""
    if lanes.QUIET.tests:
        terminalreporter.write_line(lanes.QUIET.line())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A quiet test's call has the machine to itself: the other lane waits (tests/lanes.py)."""
    if item.get_closest_marker("quiet") is None:
        yield
        return
    with lanes.alone(item.stash[_LANE]):
        yield


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = lanes.quiet_last(items, lambda i: i.get_closest_marker("quiet") is not None,
                                lambda i: i.nodeid.split("::")[0])
    if not config.pluginmanager.hasplugin("timeout"):
        return
    pending = {"testbed", "testbed_sshd"}  # testbed_faults uses testbed_sshd
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if not names & pending:
            continue
        pending -= names
        marker = item.get_closest_marker("timeout")
        current = marker.args[0] if marker and marker.args else (config.getini("timeout") or 0)
        if current and float(current) < _FIRST_SETUP_TIMEOUT_S:
            item.add_marker(pytest.mark.timeout(_FIRST_SETUP_TIMEOUT_S))
        if not pending:
            break


def _ensure(**kwargs: object) -> _tb.Testbed:
    try:
        return _tb.ensure_testbed(**kwargs)  # type: ignore[arg-type]
    except _tb.TestbedUnavailable as e:
        pytest.skip(f"test bed unavailable: {e}")


@pytest.fixture(scope="session")
def testbed() -> _tb.Testbed:
    """The whole bed: 4 sshd hosts, dockerd, higgsfield-testbase:torch2.13."""
    return _ensure(docker=True, image=True)


@pytest.fixture(scope="session")
def testbed_sshd() -> _tb.Testbed:
    """Just the sshd hosts (no dockerd, no image): quick to bring up."""
    return _ensure(docker=False, image=False)


class TestbedFaults:
    """Fault injection for one test; everything is put back at teardown."""

    __test__ = False

    def __init__(self, bed: _tb.Testbed) -> None:
        self.bed = bed
        self._stopped: set[int] = set()
        self._keys: dict[int, tuple[bytes, str]] = {}
        self._docker_added: set[int] = set()

    def stop_host(self, host: object, kill_sessions: bool = False) -> _tb.Host:
        h = self.bed.host(host)  # type: ignore[arg-type]
        if self.bed.stop_host(h, kill_sessions=kill_sessions):
            self._stopped.add(h.index)
        return h

    def start_host(self, host: object) -> int:
        h = self.bed.host(host)  # type: ignore[arg-type]
        self._stopped.discard(h.index)
        return self.bed.start_host(h)

    def rekey_host(self, host: object) -> str:
        h = self.bed.host(host)  # type: ignore[arg-type]
        self._keys.setdefault(h.index, self.bed.host_key(h))
        return self.bed.rekey_host(h)

    def add_to_docker_group(self, host: object) -> None:
        h = self.bed.host(host)  # type: ignore[arg-type]
        if not self.bed.in_docker_group(h):
            self.bed.add_to_docker_group(h)
            self._docker_added.add(h.index)

    def restore(self) -> None:
        for i, key in self._keys.items():
            self.bed.set_host_key(i, key)  # restarts sshd with the old key
        for i in self._stopped:
            self.bed.start_host(i)
        for i in self._docker_added:
            self.bed.remove_from_docker_group(i)
        self._keys.clear()
        self._stopped.clear()
        self._docker_added.clear()


@pytest.fixture
def testbed_faults(testbed_sshd: _tb.Testbed) -> Iterator[TestbedFaults]:
    faults = TestbedFaults(testbed_sshd)
    try:
        yield faults
    finally:
        faults.restore()
