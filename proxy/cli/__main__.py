"""``python -m proxy.cli``: the ``branchpoint`` command."""

from . import main

main()
