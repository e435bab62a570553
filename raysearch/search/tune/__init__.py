"""The search's Ray Tune glue: the searcher, the trainable, the stopper, ASHA over the rungs, the
session Tune's proxies reach, and the progress line. Import the modules themselves (Ray Tune is
imported with them)."""
