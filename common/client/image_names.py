"""The one rule that turns an image name someone typed into an image, for every front end.

The service keeps the names of *active* images unique (adding or activating an image
whose name an active image has is refused), so a name picks at most one image that can
boot. The rule, applied to the image objects the person may see (the API's documents):

1. an image whose id is the given text (any letter case) is that image;
2. else the one active image of that name;
3. else, when no image of that name is active, the one inactive image of that name
   (creating from it is then refused by the service, which says it is inactive);
4. several candidates at one step (a database from before the rule): ambiguous, an
   error listing each candidate's id, operating system version and state; none: not found.

`cloud` applies it to GET /v1/server-image; the controller (cloud-agent, the portal)
through controller.lookups.image_named. Pure: no I/O, only the standard library, so the
client distribution carries it as it is.
"""


class ImageNameError(LookupError):
    """The name picked no image (`ambiguous` False) or several (True); `message` says which."""

    def __init__(self, message: str, *, ambiguous: bool):
        super().__init__(message)
        self.message = message
        self.ambiguous = ambiguous


def describe(image: dict) -> str:
    """One candidate, told apart from its namesakes: id, OS version and state."""
    o = image.get("operating-system") or {}
    version = f"{o.get('name', '?')} {o.get('major_version', '?')}.{o.get('minor_version', '?')}"
    return f"{image['id']} ({version}, {'active' if image.get('active') else 'inactive'})"


def pick(images: list[dict], given: str) -> dict:
    """The image `given` names among `images` (API image objects), or ImageNameError."""
    by_id = [i for i in images if str(i["id"]).lower() == given.lower()]
    if by_id:
        return by_id[0]
    named = [i for i in images if i["name"] == given]
    active = [i for i in named if i.get("active")]
    found = active or named
    if len(found) == 1:
        return found[0]
    if not found:
        raise ImageNameError(f"no image named {given!r} that you can see", ambiguous=False)
    listed = "; ".join(describe(i) for i in found)
    raise ImageNameError(f"image name {given!r} is ambiguous, use an id: {listed}", ambiguous=True)
