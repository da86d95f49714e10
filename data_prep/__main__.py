"""`python -m data_prep` entry point."""

import sys

from data_prep.cli import main

sys.exit(main())
