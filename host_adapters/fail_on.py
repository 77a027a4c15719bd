"""What the fake adapters share: steps that fail when a test says so."""


class FailOn:
    """`fail_on[step] = error` makes that step (a method's name) raise `error` until removed.

    A fake calls `_maybe_fail(step)` where the real adapter would reach the host; its
    `check()` fails only when told to."""

    fail_on: dict[str, Exception]

    def _maybe_fail(self, step: str) -> None:
        error = self.fail_on.get(step)
        if error is not None:
            raise error

    def check(self) -> None:
        self._maybe_fail("check")
