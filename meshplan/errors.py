"""The one error type that crosses the boundary to the user."""


class MeshplanError(ValueError):
    """Bad input: the message names the field and the fix, on one line.

    The CLI prints it and exits with status 2; anything else that escapes is our bug.
    """
