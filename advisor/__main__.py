"""``python -m advisor`` is the ``advisor`` command."""

from advisor.cli import main

main()
