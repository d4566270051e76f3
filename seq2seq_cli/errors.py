"""The one exception type for problems the user can fix (bad config, bad data, bad flags)."""


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback.

    The message names the file (and line, where there is one) and what was expected.
    """
