"""The agent and its args in a stream's custom parameters, for the carriers that pass them as a
name-to-text map on the start message (Twilio's `<Parameter>`s, Telnyx's stream parameters):
`agent` names the agent, every other parameter is one of its args.
"""

from __future__ import annotations

AGENT_PARAMETER = "agent"


class AgentInParameters:
    """Mixed into a start message that has `custom_parameters` (slots-friendly: no state)."""

    __slots__ = ()
    custom_parameters: dict[str, str]

    @property
    def agent(self) -> str | None:
        """The agent the custom parameter `agent` names, if any."""
        return self.custom_parameters.get(AGENT_PARAMETER)

    @property
    def agent_args(self) -> dict[str, str]:
        """Every other custom parameter: the agent's args."""
        return {k: v for k, v in self.custom_parameters.items() if k != AGENT_PARAMETER}
