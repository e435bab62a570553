"""``python -m raysearch``: the command line, as the ``raysearch`` script."""

from raysearch.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
