"""Errors a user can fix. The CLI prints them as one line and exits 2; never a traceback."""


class UserError(Exception):
    """Bad input: the message names the bad value and the fix."""


class ConfigError(UserError):
    """A config key or value is wrong."""
