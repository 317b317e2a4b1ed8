"""What a transfer's or a placed call's destination may be: the one pattern the config, the
control API (`POST /calls`) and Plivo's signed transfer all check.

Kept out of `runtime/` so that the config schema, which every layer imports, depends on
nothing above it.
"""

from __future__ import annotations

import re

# A SIP URI for SIP calls (REFER's Refer-To) or a phone number / tel: URI for the carriers,
# which dial it themselves.
DESTINATION = re.compile(r"(sips?:[^\s<>\"]+|tel:\+?[0-9*#-]+|\+?[0-9]{3,20})")
