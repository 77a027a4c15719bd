"""The ceiling of the benchmark: Falcon + waitress serving a fixed small JSON document,
with the server's thread count, measured in the same run as the service.

    python scripts/bench/bare_app.py PORT THREADS
"""

import logging
import sys

import falcon
from waitress import serve

DOCUMENT = {"data": [], "msg": "", "success": True}


class Fixed:
    def on_get(self, req, resp):
        resp.media = DOCUMENT


if __name__ == "__main__":
    # As the service does: the queue-depth warning would flood the log under load.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    app = falcon.App()
    app.add_route("/", Fixed())
    serve(app, host="127.0.0.1", port=int(sys.argv[1]), threads=int(sys.argv[2]), ident="bare")
