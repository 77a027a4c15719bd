"""One cloud auth for several clusters, at cloud auth's side: the controllers it serves
(registry.py), the one credential each holds and what it reaches (callers.py), the
introspection of a token a controller has not seen (introspection.py), the changes feed a
controller's replica follows (feed.py), the accounts a controller registers
(accounts.py) and the catalog of clusters users read (catalog.py).

The visibility rules and their SQL do not live here: a controller keeps its own copy of the
users it needs and applies them as a single node does."""
