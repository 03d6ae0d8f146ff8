"""`python -m client chat|speech|transcribe|image|edit|video ...` (see client/cli.py)."""
import sys

from client.cli import main

sys.exit(main())
