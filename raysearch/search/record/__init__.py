"""The record of a search: the journal, the recorder of finished trials, the files a search owns
(layout), its output folder and the disk checks."""
