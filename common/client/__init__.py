"""The Python library of the cloud controller's user side: what the `cloud` command is built on.

    from common.client import Client, ApiError

    client = Client("http://127.0.0.1:8080", api_key=KEY, api_secret=SECRET)
    server = client.create_server(image=IMAGE_ID, flavor=FLAVOR_ID)
    print(server.hostname, server.private_ip)

It needs `requests` and nothing else of the project (docs/client.md).
"""

from common.client.errors import ApiError, ClientError, LoginEnded, NotTheApi, Unreachable
from common.client.models import (Action, ActionPage, Console, Flavor, Group, Image, Limit, Limits, Server, Token,
                                  User, Volume)
from common.client.session import Client

__all__ = [
    "Action", "ActionPage", "ApiError", "Client", "ClientError", "Console", "Flavor", "Group", "Image", "Limit",
    "Limits", "LoginEnded", "NotTheApi", "Server", "Token", "Unreachable", "User", "Volume",
]
