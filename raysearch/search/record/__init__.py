"""The record of a search: the journal, the recorder, the output folder, the probe cache."""
