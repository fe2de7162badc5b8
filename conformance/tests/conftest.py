from impls import FRAMEWORK_PORTS


def pytest_generate_tests(metafunc):
    # Direct parametrisation, not a fixture: hypothesis re-runs the test body per example.
    if "port" in metafunc.fixturenames:
        metafunc.parametrize("port", FRAMEWORK_PORTS)
