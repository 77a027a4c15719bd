"""`GET /v1/auth/catalog`: the clusters one login reaches, for any signed-in user."""

from falcon import testing

from api.app import create_app
from controller.cloud_auth import registry
from tests.fixtures.api import make_caller, new_context, user_envelope, config_values_for


def test_a_single_node_lists_itself(ctx):
    alice = make_caller(ctx, "alice@example.org")
    client = testing.TestClient(create_app(ctx, interfaces=("controller", "user")))
    got = user_envelope(client.simulate_get("/v1/auth/catalog", headers=alice.headers), 200, data=True)
    assert got == {"controllers": [{"id": 1, "name": "cluster-1", "url": "", "enabled": True}], "default": 1}
    user_envelope(client.simulate_get("/v1/auth/catalog"), 401)


def test_the_clusters_registered_and_the_default(tmp_path):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = "user"
    values["controller"].update(name="", url="")
    ctx = new_context(values)
    alice = make_caller(ctx, "alice@example.org")
    client = testing.TestClient(create_app(ctx, interfaces=("user",)))
    for n, name in ((3, "hpc3"), (2, "hpc2")):
        registry.add_controller(ctx, controller_id=n, name=name, url=f"https://{name}.example.org:8080/")
    registry.set_enabled(ctx, 2, False)
    got = user_envelope(client.simulate_get("/v1/auth/catalog", headers=alice.headers), 200, data=True)
    assert got == {"controllers": [
        {"id": 2, "name": "hpc2", "url": "https://hpc2.example.org:8080", "enabled": False},
        {"id": 3, "name": "hpc3", "url": "https://hpc3.example.org:8080", "enabled": True}], "default": 3}
    ctx.store.close()


def test_a_named_cluster(tmp_path):
    values = config_values_for(tmp_path)
    values["controller"].update(name="hpc-main", url="https://hpc.example.org:8080")
    ctx = new_context(values)
    alice = make_caller(ctx, "alice@example.org")
    client = testing.TestClient(create_app(ctx, interfaces=("controller", "user")))
    got = user_envelope(client.simulate_get("/v1/auth/catalog", headers=alice.headers), 200, data=True)
    assert got["controllers"] == [{"id": 1, "name": "hpc-main", "url": "https://hpc.example.org:8080",
                                   "enabled": True}]
    ctx.store.close()
