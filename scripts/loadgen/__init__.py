"""The load generator behind scripts/loadtest.py, in pieces: simulated callers, the levels of
concurrency they run in, the servers they call, the /proc sampling beside them and the report at
the end. scripts/loadtest.py is the entry point and only parses the command line; importing this
package puts the repository root first on sys.path, so that `voice_agent` comes from this
checkout whether or not it is installed."""

import sys

from .paths import ROOT

sys.path.insert(0, str(ROOT))
