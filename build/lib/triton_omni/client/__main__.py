"""`python -m triton_omni.client chat|speech|transcribe|image|edit|video ...` (see client/cli.py)."""
import sys

from triton_omni.client.cli import main

sys.exit(main())
