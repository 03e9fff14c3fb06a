"""Fixtures shared by the whole suite.

- ``ray_cluster``: one local Ray instance for the whole test process; end-to-end modules start
  their ``Server`` (tests/support/cluster.py) on it, each in its own namespace.
- ``client``: a gRPC client of the module's ``server`` fixture, per test.
- ``tenants_server``: a server per module with API keys on (``tests.support.servers.TENANTS``)
  for the modules that test tenants' rights (tests/test_e2e_status_codes.py,
  tests/test_e2e_forks.py); each of their tests leaves it clean, and one that kills a replica
  waits for its replacement.
- ``SESSION_ROUTER_TEST_DEVICE`` (tests/support/device.py): the device every engine and pool
  fixture builds on (cpu by default; cuda in scripts/gpu-check.sh); an unusable one stops the run.
- Hypothesis profiles, which every property test and state machine runs under (none sets its
  own sizes): ``ci`` (the default) and ``soak`` (long runs: ``HYPOTHESIS_PROFILE=soak``). ``ci``
  is hypothesis' default size, 100 examples of up to 50 steps: the session, pool and engine
  machines take a few seconds each, and each finds every seeded bug it was tried against
  (leaking releases, closes not deferred, idle timeouts that ignore turns, wrong KV reservations,
  lost interrupted input) in its first second. A failure prints the failing program and the
  ``@reproduce_failure`` line that replays it.
"""

from __future__ import annotations

import logging
import os

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs two xdist workers, each module whole on one (--dist loadfile). Ray
    # keeps "the machine's cluster" (what `--address auto` joins, and what a dead `ray start`
    # leaves behind) under $TMPDIR/ray: each worker, and every process it starts, has a TMPDIR
    # of its own, so that one worker's `ray start` clusters are not the other's machine.
    os.environ["TMPDIR"] = os.path.join("/tmp", f"session-router-tests-{worker}")
    os.makedirs(os.environ["TMPDIR"], exist_ok=True)

from router.ops import ray_join  # noqa: E402

ray_join.prepare(None)  # before Ray is imported: the suite's local Ray stays on loopback

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.support.device import ENV, check_test_device, device_under_test  # noqa: E402

# Ray and the servers are imported by the fixtures that use them: the engine, pool and model
# tests run where Ray is not installed (scripts/gpu-check.sh on a GPU machine's own Python).

settings.register_profile(
    "ci",
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "soak",
    max_examples=2000,
    stateful_step_count=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config) -> None:
    """A device the engine and pool fixtures cannot use stops the run before any test."""
    if (why := check_test_device()) is not None:
        pytest.exit(f"cannot run on the test device: {why}", returncode=4)


def pytest_report_header(config) -> str:
    return f"engine and pool fixtures on: {device_under_test()} ({ENV})"


@pytest.fixture(scope="session")
def ray_cluster():
    """A new local Ray for every end-to-end test of this process (on loopback, no dashboard)."""
    import ray

    from router.ops.serve import quiet_ray_start_up

    if not ray.is_initialized():
        quiet_ray_start_up()
        ray.init(
            address="local",  # never a cluster `ray start` left on the machine (its own or not)
            logging_level=logging.WARNING,
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
            namespace="session-router-tests",
        )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tenants_server(ray_cluster, tmp_path_factory):
    """A server with API keys on (``TENANTS``, from a keys file), for the modules that test
    what each tenant may do. One per module, stopped at its end: a server that lived for the
    whole session would hold its replicas' CPU share, and later modules' replicas could not be
    placed."""
    from tests.support.servers import TENANTS, api_keys_file, serve_cluster

    keys = api_keys_file(tmp_path_factory.mktemp("keys"), TENANTS)
    with serve_cluster(api_keys=keys, open_timeout_s=1.0) as srv:
        yield srv


@pytest.fixture
def client(server):
    """A gRPC client of the module's ``server`` fixture, closed after the test (a module with
    other clients defines its own)."""
    from tests.support.servers import grpc_client

    with grpc_client(server.address) as c:
        yield c
