"""Job scripts that turn on the channel from inside the node, for the bounds tests of each provider."""

from __future__ import annotations

# The job finds its own status URL in the manifest beside its folder and links it to /dev/zero.
POISON_STATUS = (
    "p=$(sed -n 's|^status_put file://||p' ../manifest); echo poisoning; sleep 1; ln -sf /dev/zero \"$p\"; sleep 120"
)
