"""The one exception type data_prep raises for problems a user can fix (bad input, wrong directory, ...)."""

from __future__ import annotations

from common.errors import UserError


class DataPrepError(UserError):
    """A user-facing problem; the message names the file (and line/record) concerned.

    A `common.errors.UserError` (so a ValueError): the CLI prints it as one line and exits with code 2, without a
    traceback.
    """
