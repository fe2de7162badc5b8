import pytest

from impls import FRAMEWORK_PORTS


@pytest.fixture(params=FRAMEWORK_PORTS)
def port(request):
    """Each framework port by name: torch, mlx, jax."""
    return request.param
