"""The error a request a client can fix raises: its message names the field and the limit."""


class InvalidRequestError(ValueError):
    """A request cannot be served as given; the message names the field and the limit."""
