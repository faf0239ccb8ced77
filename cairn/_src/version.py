"""The version of Cairn, in one place."""

__version__ = "0.1.0"
