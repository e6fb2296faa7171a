"""Why the scheduler refuses a request or gives up on one, as domain errors.

No HTTP here: `serve_app.openai.errors` maps each to its status (429, 503) and
its `Retry-After`.
"""

from __future__ import annotations


class Refused(Exception):
    """The request was not served; the client may try again after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class Overloaded(Refused):
    """The pool's queue is full (or past the batch share): shed at admission."""


class RateLimited(Refused):
    """The client's API key is over its requests/s or tokens/min."""


class Unavailable(Refused):
    """No replica could serve the request after the allowed tries."""


class ReplicaUnavailable(Exception):
    """One attempt could not be served (replica lost, draining, refusing load): try another."""

    def __init__(self, message: str, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica
        """The replica (actor id) found gone for good, which later attempts avoid; None if none or not for good."""


class DeadlineExceeded(Exception):
    """The request ran past the ingress's `request_timeout_s`."""
