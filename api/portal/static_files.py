"""The portal's style sheet: files read once at start, served by name (no path from the client
reaches the file system)."""

from pathlib import Path

import falcon

_TYPES = {".css": "text/css; charset=utf-8"}
_FOLDER = Path(__file__).parent / "static"


class Static:
    anonymous = True
    static = True  # the guard neither reads a session nor checks anything for these
    public = True  # no API token: the portal's guard decides (these need no session)

    def __init__(self):
        self.files = {p.name: (p.read_bytes(), _TYPES[p.suffix]) for p in _FOLDER.iterdir() if p.suffix in _TYPES}

    def on_get(self, req, resp, name):
        found = self.files.get(name)
        if found is None:
            raise falcon.HTTPNotFound()
        resp.data, resp.content_type = found


def add_routes(app) -> None:
    app.add_route("/portal/static/{name}", Static())
