"""What the tests of cloud auth's calls share: the app both interfaces serve, and one
registered controller."""

import pytest
from falcon import testing

from controller.cloud_auth import registry


@pytest.fixture
def app_client(ctx):
    from api.app import create_app

    return testing.TestClient(create_app(ctx, interfaces=("controller", "user")))


@pytest.fixture
def hpc(ctx):
    """Controller 2 (hpc1) and its secret, as `cloud-agent controller add` makes them."""
    return registry.add_controller(ctx, controller_id=2, name="hpc1", url="https://hpc1.example.org:8080")
