"""``python -m raysearch``: the command line, as the ``raysearch`` script."""

from raysearch.cli import console_main

if __name__ == "__main__":
    console_main()
