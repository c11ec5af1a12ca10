"""The errors of nnx, raised with nnx's own message: the file and entry, what was expected and
what was found, and what to do."""


class Error(Exception):
    """Any error of nnx."""


class IoError(Error):
    """A file or folder that cannot be opened, read or written."""


class FormatError(Error):
    """A file that is not a valid archive of its format (a damaged header, a refused pickle
    global, a truncated file)."""


class EntryError(Error, KeyError):
    """A name the archive does not hold."""

    def __str__(self) -> str:
        # KeyError would quote the message as a key.
        return str(self.args[0]) if self.args else ""


class RemoteError(Error):
    """A location in an object store or on the Hub that cannot be read."""
