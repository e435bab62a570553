"""``python -m raysearch``: the command line, as the ``raysearch`` script."""

from raysearch.cli import main

raise SystemExit(main())
