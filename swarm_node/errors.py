"""Exceptions whose message is meant for the person at the terminal (printed without a traceback)."""


class UserFacingError(Exception):
    """A problem the user can fix (bad config, missing file, unreachable peer); the message says how."""


class ConfigError(UserFacingError):
    """A config file or override is invalid; the message names the key, the value and what is allowed."""
