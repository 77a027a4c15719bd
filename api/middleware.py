"""Request-wide checks: body size and authentication."""

from api.errors import PayloadTooLarge
from controller.auth import authenticate
from controller.context import Context


class BodyLimit:
    def __init__(self, limit: int):
        self.limit = limit

    def process_request(self, req, resp):
        if req.content_length is not None and req.content_length > self.limit:
            raise PayloadTooLarge(f"request body over {self.limit} bytes")


class Authenticate:
    """Every resource needs the auth headers unless it says `public = True`."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def process_resource(self, req, resp, resource, params):
        if resource is None or getattr(resource, "public", False):
            return
        req.context.requester = authenticate(
            self.ctx,
            token=req.get_header("X-Auth-Token"),
            user_id=req.get_header("X-Auth-Cloudauth-Id"),
        )
