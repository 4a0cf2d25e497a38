"""Errors the CLI turns into one-line messages and documented exit codes."""

EXIT_OK = 0
EXIT_PARITY = 1  # a case is outside its scenario's expectation
EXIT_CONFIG = 2  # usage or configuration error (bad YAML, unknown engine, missing model)
EXIT_UNAVAILABLE = 3  # an engine's package or interpreter is not available
EXIT_INTERRUPTED = 130


class ParityError(Exception):
    """An error with a user-facing one-line message and an exit code."""

    exit_code = EXIT_CONFIG

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(ParityError):
    exit_code = EXIT_CONFIG


class EngineUnavailable(ParityError):
    exit_code = EXIT_UNAVAILABLE
