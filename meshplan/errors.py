"""The one error type that crosses the boundary to the user."""


class MeshplanError(ValueError):
    """Bad input: the message names the field and the fix, on one line.

    The CLI prints it and exits with status 2; anything else that escapes is our bug.
    """


def read_json(path) -> object:
    """The JSON in the file at `path`; a missing, unreadable or malformed file is a MeshplanError naming
    the file and where it breaks."""
    import json
    from pathlib import Path

    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise MeshplanError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        msg = exc.msg.removesuffix(" at")  # "Invalid control character at", which names no place itself
        raise MeshplanError(f"{path}: not valid JSON ({msg}, line {exc.lineno} column {exc.colno})") from None
