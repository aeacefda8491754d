"""The one exception type the CLI turns into a one-line message and exit code 2.

Anything a user can fix by changing their input (grid file, flags, data location, device, tracking
URI) raises `UserError`; everything else is a bug or a per-run failure and is handled elsewhere.
"""


class UserError(Exception):
    """Bad input: printed as ``error: <message>`` and exits with code 2, before anything trains."""

    exit_code = 2
