"""`python -m epbuild`: the `epbuild` command."""

import sys

from .command import main

sys.exit(main())
