"""`python -m mtwork ...`: the `mtwork` command."""

import sys

from .cli import main

sys.exit(main())
