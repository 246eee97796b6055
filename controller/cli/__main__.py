"""``python -m reflexarc.controller.cli``: the ``reflexarc`` command."""
import sys

from .main import main

sys.exit(main())
