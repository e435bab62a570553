"""The search's Ray Tune glue (import the modules themselves: Ray Tune comes with them)."""
