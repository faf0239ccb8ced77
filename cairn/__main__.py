"""``python -m cairn``: the ``cairn`` command line."""

from cairn._src.cli.main import run

if __name__ == "__main__":
    run()
