"""Bytes in and out: array codecs for the wire, tensor files on disk, the marker of a private folder,
network limits, and progress bars that suit where they are written."""
