"""A guest's serial console output as the hypervisor keeps it: what a read answers.

The output of one run of the guest (one QEMU process: a start, not a reset) is kept
by its host, bounded, and read back through the hypervisor adapter, so it is readable
for instances on every host. A reset (the API's reboot) keeps the run: a caller that
wants only what came after it remembers where the output ended (a ConsoleMark) and
reads from there.
"""

from dataclasses import dataclass

from common.errors import InvalidInput

# The most a read takes from the host: the API's largest `bytes`.
MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ConsoleMark:
    """Where a run's output ended at some moment: `run` names the run, `size` counts the
    bytes of it the host kept then."""

    run: str
    size: int


@dataclass(frozen=True)
class ConsoleOutput:
    """The end of the kept output of the instance's last run.

    `data`: at most the bytes asked for, after the mark given (when it is of this run);
    `mark`: where the output ends now, None when no guest runs (shut off, no domain):
    the data is then what the last run left; `running`: whether a guest runs now.
    """

    data: bytes
    mark: ConsoleMark | None

    @property
    def running(self) -> bool:
        return self.mark is not None


def start_of_tail(size: int, max_bytes: int, since: ConsoleMark | None, run: str | None) -> int:
    """Where the last max_bytes of `size` kept bytes begin, not before `since` when that mark
    is of this run (a mark past the end is of an output that was cut: it counts as the end)."""
    start = max(0, size - max_bytes)
    if since is not None and run is not None and since.run == run:
        start = max(start, min(since.size, size))
    return start


def check_max_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        raise InvalidInput(f"max_bytes must be an integer from 0 to {MAX_BYTES}, not {value!r}")
    return value
