"""One call's driver: the pipeline that moves a call's audio and text between its transport, its
engines, the call core and the agent, with its hold audio and recording."""
