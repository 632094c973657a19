"""The warnings a logger gives inside a block, as a list of messages: what a report of them (`glimmer inspect`,
the nano model's evaluation) lists beside the logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _WarningMessages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def captured_warnings(logger_name: str, *, at_warning_level: bool = False) -> Iterator[list[str]]:
    """The messages of the warnings (and errors) logged by `logger_name` and the loggers under it inside the block.
    With `at_warning_level` the logger's level is WARNING inside the block (restored after), so that a quieter
    level drops none and nothing below a warning is made."""
    handler = _WarningMessages()
    logger = logging.getLogger(logger_name)
    level = logger.level
    if at_warning_level:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
