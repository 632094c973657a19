"""The `glimmer` command's entry point: the installed script's and `python -m glimmer`'s (where the installed script
is not on PATH: a `pip install --user`, a virtual environment that is not activated)."""

import sys

from glimmer.sigterm import record_sigterm


def main() -> int:
    """`glimmer.cli.main` with SIGTERM noted from the start (glimmer.sigterm), before glimmer.cli's imports, and
    Ctrl-C during them ending the command as it does later (status 130), without a traceback."""
    record_sigterm()
    try:
        from glimmer.cli import main as run_command

        return run_command()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
